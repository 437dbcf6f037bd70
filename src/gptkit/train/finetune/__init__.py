"""Fine-tuning (GPT-1 §3.2): the settings (:mod:`.config`), the discriminative tasks' run
(:mod:`.tasks`), generation's (:mod:`.generation`) and what they share (:mod:`.common`)."""
