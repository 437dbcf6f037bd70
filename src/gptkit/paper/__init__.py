"""The GPT-1 paper's experiments: its fine-tuning tables (``gptkit suite``) and Figure 2."""
