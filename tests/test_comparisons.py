"""The benchmarks' comparisons as scripts/list_comparisons.py lists them: each names its peer and how
the peer ran, each record names the commit it measured, and none sets batched gptkit against a peer
fed one example at a time without calling it the gain from batching."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gptkit.testing.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "list_comparisons.py"


def _listing():
    return load_script("list_comparisons")


def test_every_comparison_names_its_peer_and_every_record_its_commit():
    listing = _listing()
    rows = listing.rows()
    assert len(rows) > 50  # every benchmark's rows: few means the reader broke
    assert all(isinstance(row["peer"], str) and row["peer"].strip() for row in rows)
    for path in sorted((REPO / "results").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record.get("commit"), f"{path.name} does not name the commit it measured"


def test_no_batching_gain_passes_as_speed():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_catches_an_unlabelled_batching_gain(tmp_path):
    """A planted record: batch 32 against one pair at a time fails the check until it says what it is."""
    row = {"what": "zero-shot tok/s, batch 32", "unit": "tok/s", "ours": 2.0, "peer_value": 1.0, "ratio": 2.0}
    record = {
        "benchmark": "planted",
        "commit": "0" * 40,
        "comparisons": [row | {"peer": "hf, one pair at a time"}],
    }
    (tmp_path / "planted.json").write_text(json.dumps(record))
    check = [sys.executable, str(SCRIPT), "--check", "--results", str(tmp_path)]
    failed = subprocess.run(check, capture_output=True, text=True)
    assert failed.returncode == 1 and "planted.json" in failed.stdout
    record["comparisons"][0]["peer"] = "hf, one pair at a time (the gain from batching)"
    (tmp_path / "planted.json").write_text(json.dumps(record))
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    same_batch = row | {
        "what": "zero-shot tok/s, batch 32",
        "peer": "hf, batches of 32 with an attention mask",
    }
    assert not _listing().batching_unlabelled(same_batch)


def test_a_kept_result_is_not_a_change_to_the_code_measured(tmp_path):
    """`make bench` keeps each benchmark's JSON before the next one starts: the next still names the
    commit alone; a changed source file makes it "+changes"."""
    from gptkit.testing.provenance import source_commit

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    head = git("rev-parse", "HEAD")
    (tmp_path / "results" / "a.json").write_text('{"kept": 1}')
    assert source_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == head + "+changes"
