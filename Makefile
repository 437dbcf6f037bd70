# gptkit: `make demo` runs the whole job end to end, `make test` the test suite (`make test-fast`
# without the tests marked slow). `make demo` and `make paper` write only under $(RUNS) (and .venv,
# data/); `make keep-demo` and `make keep-paper` keep a run's figures in results/ and re-render
# docs/results.md, as a step of its own.
# Each target sets up .venv on first use (and again when pyproject.toml or constraints.txt
# changes), with the exact tested versions of constraints.txt: `make demo` the package and the
# extras its stages import (gpt1: the vocabulary's ftfy and spaCy; plot: the loss curve), every
# other target the whole `dev` environment. Both share one .venv: the dev set-up holds the demo's
# (its stamp marks both), and after the demo's it installs only what is missing.

VENV    ?= .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
DEMO_EXTRAS := gpt1,plot
# The public datasets and vocabularies: ../shared/data beside the checkout when it exists, else
# data/, which `make demo` fills from the datasets' public sources (gptkit data fetch).
DATA    ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),$(abspath data))
RUNS    ?= runs
# The test processes (pytest-xdist, a test file each at a time): one a core on the 2-core machines
# the suite is sized for; `make test WORKERS=0` runs it in this one process.
WORKERS ?= 2
# The whole demo's wall-clock budget, counted from when make started: the set-up counts, and
# pre-training and fine-tuning share what it leaves (a slower CPU gets fewer updates, not more time).
# `make demo DEMO_BUDGET=30m` trains both longer; DEMO_SEEDS=3 fine-tunes each side three times at
# most (by default as many times as the time holds).
DEMO_BUDGET ?= 15m
DEMO_SEEDS ?=
DEMO_STARTED := $(shell date +%s)
# `make demo INIT=openai-gpt`: fine-tune OpenAI's published GPT-1 (or any Hub name or model folder)
# beside random weights of its shape, instead of pre-training, within the same budget.
INIT ?=

.PHONY: setup demo keep-demo test test-fast bench fuzz paper keep-paper lint clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -c constraints.txt -e ".[dev]"
	$(PYTHON) -m gptkit.native
	touch $(STAMP) $(DEMO_STAMP)

# The demo's set-up: nothing to do where the dev environment is installed and up to date (as make
# judges it: no file it depends on newer; files stamped in one clock tick have equal times, where
# `$(STAMP) -nt pyproject.toml` is false).
$(DEMO_STAMP): pyproject.toml constraints.txt
	@if [ -f $(STAMP) ] && ! [ pyproject.toml -nt $(STAMP) ] && ! [ constraints.txt -nt $(STAMP) ]; then \
		touch $(DEMO_STAMP); \
	else \
		set -e; python3 -m venv $(VENV); \
		$(PYTHON) -m pip install -q --upgrade pip; \
		echo "installing gptkit[$(DEMO_EXTRAS)] into $(VENV)"; \
		$(PYTHON) -m pip install -q -c constraints.txt -e ".[$(DEMO_EXTRAS)]"; \
		$(PYTHON) -m gptkit.native; \
		touch $(DEMO_STAMP); \
	fi

setup: $(STAMP)

# Without ../shared/data, the tests' public data is fetched into data/ first (a few MB); where it
# cannot be (no network), the tests that need it skip, each naming the command that fetches it.
TEST_DATA = test -d "$(DATA)/gpt2_bpe" -a -d "$(DATA)/gutenberg" || $(PYTHON) -m gptkit data fetch --all \
	--out "$(DATA)" || echo "could not fetch the public data into $(DATA): the tests that read it will skip"

test: $(STAMP)
	@$(TEST_DATA)
	GPTKIT_DATA=$(DATA) $(PYTHON) -m pytest -n $(WORKERS) --dist loadfile

# The suite less its slowest tests (marked slow: a demo, training processes, servers): about 75 s
# on 2 cores, for the edit-test loop; `make test` before a commit still runs them all.
test-fast: $(STAMP)
	@$(TEST_DATA)
	GPTKIT_DATA=$(DATA) $(PYTHON) -m pytest -m "not slow" -n $(WORKERS) --dist loadfile

demo: $(DEMO_STAMP)
	@test -d "$(DATA)/gutenberg" -a -d "$(DATA)/story_cloze_2016" || $(PYTHON) -m gptkit data fetch --demo --out "$(DATA)"
	GPTKIT_DATA=$(DATA) $(PYTHON) -m gptkit demo --data $(DATA) --out $(RUNS)/demo \
		--time-budget $(DEMO_BUDGET) --budget-start $(DEMO_STARTED) \
		$(if $(INIT),--init $(INIT)) $(if $(DEMO_SEEDS),--seeds $(DEMO_SEEDS))

# A demo run's figures into results/demo.json and docs/results.md (the project's record).
keep-demo: $(DEMO_STAMP)
	$(PYTHON) scripts/render_results.py --keep demo $(RUNS)/demo/summary.json

# The paper's experiments on a CPU slice (docs/paper.md): pre-train a GPT with the demo's recipe
# (`gptkit pretrain --recipe minutes`), then every fine-tuning task of Tables 2-4 with Table 5's ablations
# (full and no_pretraining with PAPER_SEEDS seeds each), and Figure 2 (left and right). On a
# machine without the data (no story_cloze_2016/ in DATA) the datasets are fetched first; a task
# whose files are still missing is listed in results.md with the command that fetches it.
PAPER      ?= $(RUNS)/paper
# Pre-training's share of make paper's 60 minutes on 2 cores; the paper's effect grows with
# pre-training (docs/paper.md).
PAPER_PRE  ?= 18m
# Seeds of `full` and `no_pretraining`: with 3 or more their differences' standard errors count the
# training noise, not only the examples (docs/paper.md). `no_aux_lm` keeps one seed, run by a second
# suite invocation on the same --out (the reports then hold all three variants).
PAPER_SEEDS ?= 3
# The suite's slice, from the time (2 cores): on 2,000 examples a task, 3 variants x 1 seed took
# about 20 minutes, 6.7 a variant-seed, roughly in proportion to the examples trained on and
# scored. With PAPER_SEEDS=3 it runs 3 + 3 + 1 = 7 variant-seeds. Of the 60 minutes, pre-training
# takes 18, Figure 2 about 7, the tokenizer and shards under 1, and 4 are kept for the spread
# between runs (the same suite took 15 to 19.5 minutes): 30 for the suite, 30 / 7 = 4.3 minutes a
# variant-seed, 2,000 x 4.3 / 6.7 = 1,280 examples: 1,250 a task, trained on and scored.
PAPER_SLICE ?= --max-train-examples 1250 --max-eval-examples 1250 --lr 1e-3
# Figure 2 left (five fine-tunings of one task) keeps the 500-example slice and one seed (its
# `--seeds` would multiply its time); its table says that its error counts the examples only.
FIGURE_SLICE ?= --max-train-examples 500 --max-eval-examples 500 --lr 1e-3
CORPUS      = $(DATA)/gutenberg/*.txt $(DATA)/tinyshakespeare/input.txt
PAPER_DATA  = gutenberg tinyshakespeare sst2 cola rte mrpc stsb story_cloze snli mnli qnli scitail qqp race
paper: $(STAMP)
	@test -d "$(DATA)/story_cloze_2016" || $(PYTHON) -m gptkit data fetch $(PAPER_DATA) --out "$(DATA)"
	test -f $(PAPER)/tokenizer/tokenizer_config.json || $(PYTHON) -m gptkit tokenizer train --corpus $(CORPUS) \
		--vocab-size 8000 --style gpt1 --out $(PAPER)/tokenizer
	test -f $(PAPER)/shards/meta.json || $(PYTHON) -m gptkit prepare $(CORPUS) \
		--tokenizer $(PAPER)/tokenizer --out $(PAPER)/shards --val-fraction 0.02
	test -f $(PAPER)/pretrain/config.json || $(PYTHON) -m gptkit pretrain --recipe minutes \
		--data $(PAPER)/shards --out $(PAPER)/pretrain --max-steps 100000 --time-budget $(PAPER_PRE) \
		--eval-every 100 --checkpoint-every 100 --keep-checkpoints 1000 --eval-windows 64 --no-progress \
		$$(test -d $(PAPER)/pretrain/checkpoints && echo --resume)
	$(PYTHON) -m gptkit suite --init $(PAPER)/pretrain --data-dir $(DATA) --out $(PAPER)/suite \
		--variants full no_pretraining --seeds $(PAPER_SEEDS) $(PAPER_SLICE) --no-progress
	$(PYTHON) -m gptkit suite --init $(PAPER)/pretrain --data-dir $(DATA) --out $(PAPER)/suite \
		--variants no_aux_lm --seeds 1 $(PAPER_SLICE) --no-progress
	$(PYTHON) -m gptkit figure2 layers --init $(PAPER)/pretrain --task story_cloze --data-dir $(DATA) \
		--out $(PAPER)/figure2-layers $(FIGURE_SLICE) --no-progress
	$(PYTHON) -m gptkit figure2 zeroshot --run $(PAPER)/pretrain --data-dir $(DATA) \
		--out $(PAPER)/figure2-zeroshot --limit 500

keep-paper: $(STAMP)
	$(PYTHON) scripts/render_results.py --keep paper $(PAPER)/suite/results.json

# Each benchmark prints its JSON and keeps it in results/; scripts/render_results.py renders them
# into docs/results.md's tables (the reliability campaign's are `make fuzz`'s). A CPU without
# AVX-512 keeps its decoding run as generate_throughput_avx2_cpu.
bench: $(STAMP)
	@mkdir -p results
	@for b in benchmarks/*.py; do case $$b in *fuzz_campaign.py|*serve_soak.py) continue;; esac; \
		GPTKIT_DATA=$(DATA) GPTKIT_RESULTS=results $(PYTHON) $$b || exit 1; done
	$(PYTHON) scripts/render_results.py

# The reliability campaign (docs/operations.md): 10,000 damaged inputs for each kind of file gptkit
# reads, the server fuzzed from its OpenAPI document (results/fuzz.json), then 10 minutes of steady
# load on a server (results/serve_soak.json); both rendered into operations.md (about an hour on 2
# cores). It fails when an input failed or memory grew, after rendering what it found.
fuzz: $(STAMP)
	GPTKIT_DATA=$(DATA) $(PYTHON) benchmarks/fuzz_campaign.py; status=$$?; \
		$(PYTHON) benchmarks/serve_soak.py || status=1; \
		$(PYTHON) benchmarks/fuzz_campaign.py --render && $(PYTHON) benchmarks/serve_soak.py --render && exit $$status

lint: $(STAMP)
	$(PYTHON) -m ruff check src tests benchmarks
	$(PYTHON) -m ruff format --check src tests benchmarks

clean:
	rm -rf $(RUNS) .pytest_cache
