"""The playground page of `gptkit serve` in a real browser: headless Debian chromium driven by selenium.

The real server runs in a subprocess with a tiny model built here. The reference for what the page shows
is the same seeded request sent straight to ``/v1/completions``: the page must show exactly its tokens,
shaded by exactly its probabilities, with its alternatives on hover.

The test is skipped when chromium, chromedriver or selenium is missing, except on CI (``CI`` set), where
that fails it. ``GPTKIT_PLAYGROUND_SCREENSHOT=FILE`` saves the screenshot there too (e.g. the docs').
"""

from __future__ import annotations

import colorsys
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

httpx = pytest.importorskip("httpx")

from .test_serve import AUTH, KEY, MODEL, Server  # noqa: E402

pytestmark = pytest.mark.slow  # a server and a real browser

# Chromium in a container: no sandbox (no user namespaces), no GPU, no /dev/shm, and nothing that
# would phone home or fetch updates: the test reaches only 127.0.0.1.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1280,860",
)
WAIT_S = 60  # the longest a page may take to finish a generation
PROMPT = "<b>Alice</b> was"  # markup in the prompt must come out as text
SETTINGS = {"temperature": "0.9", "top-k": "50", "top-p": "0.95", "max-tokens": "24"}
SEED = 7


def _missing_browser() -> str | None:
    """Why the browser test cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    missing = [name for name in ("chromium", "chromedriver") if _find(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found (apt-get install chromium chromium-driver)"
    return None


def _find(name: str) -> str | None:
    return shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)


@pytest.fixture(scope="module")
def model_dir(data_dir, tmp_path_factory) -> Path:
    from gptkit import GPT, GPTConfig
    from gptkit.tokenizer import Tokenizer

    directory = tmp_path_factory.mktemp("playground") / "model"
    torch.manual_seed(0)
    config = GPTConfig.from_preset(
        "tiny", vocab_size=50257, context_length=256, ln_position="pre", dropout=0.0, init_std=0.2
    )
    model = GPT(config)
    with torch.no_grad():
        # Logits with a spread of a few units, as a trained model's (not a near-uniform 1/50257): the
        # probabilities of the sampled tokens then differ, and so does their shading.
        model.ln_f.weight.fill_(4.0)
    model.save_pretrained(directory)
    Tokenizer.from_pretrained(data_dir / "gpt2_bpe").save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def task_dirs(model_dir, tmp_path_factory) -> dict[str, Path]:
    """Two fine-tuned models beside the language model: a classifier and a multiple-choice model."""
    from gptkit import GPT
    from gptkit.data.tasks import TaskSpec, special_token_ids
    from gptkit.model.task import TaskModel
    from gptkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(model_dir)
    specials = special_token_ids(tokenizer)
    specs = {
        "sentiment": TaskSpec(
            "classification", labels=["negative", "positive", "neutral"], max_length=64, specials=specials
        ),
        "story": TaskSpec("multiple_choice", n_choices=2, max_length=64, specials=specials),
    }
    directories = {}
    for seed, (name, spec) in enumerate(specs.items()):
        torch.manual_seed(seed)
        gpt = GPT.from_pretrained(model_dir)
        gpt.add_special_tokens(max(specials.values()) + 1 - gpt.config.total_vocab_size)
        model = TaskModel(gpt, spec, tokenizer=tokenizer)
        with torch.no_grad():
            model.head.weight.normal_(0.0, 0.05)  # probabilities that differ from class to class
        directories[name] = tmp_path_factory.mktemp("playground-tasks") / name
        model.save_pretrained(directories[name])
    return directories


@pytest.fixture(scope="module")
def server(model_dir, task_dirs, tmp_path_factory):
    models = {MODEL: model_dir, **task_dirs}  # the page generates with the language model
    server = Server(models, tmp_path_factory.mktemp("playground-logs") / "server.log", "--api-key", KEY)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    reason = _missing_browser()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the playground's browser test: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _find("chromium")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    # An explicit driver: selenium must not go looking for (or downloading) one.
    driver = webdriver.Chrome(service=Service(executable_path=_find("chromedriver")), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_page_is_served_without_a_key_and_only_from_self(server):
    page = httpx.get(f"{server.base}/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "unsafe-inline" not in policy
    assert "://" not in page.text  # nothing from another host: no CDN, no fonts
    assert f'content="{MODEL}"' in page.text and 'content="required"' in page.text
    for name, media_type in (("playground.js", "text/javascript"), ("playground.css", "text/css")):
        asset = httpx.get(f"{server.base}/static/{name}", timeout=10)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(media_type)
        assert "://" not in asset.text
    assert httpx.get(f"{server.base}/static/index.html.bak", timeout=10).status_code == 404
    assert httpx.get(f"{server.base}/static/..%2Fapp.py", timeout=10).status_code == 404
    assert httpx.get(f"{server.base}/v1/models", timeout=10).status_code == 401  # the API keeps its key


def _set_slider(browser, slider_id: str, value: str) -> None:
    browser.execute_script(
        "const el = document.getElementById(arguments[0]); el.value = arguments[1];"
        "el.dispatchEvent(new Event('input', {bubbles: true}));",
        slider_id,
        value,
    )


def _generate(browser, server: Server, key: str) -> str:
    """Fill in the form, click Generate and wait for the stream to end; the page's final state."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server.base}/")
    key_field = browser.find_element(By.ID, "api-key")
    assert key_field.is_displayed()  # the server has a key, so the page asks for it
    key_field.send_keys(key)
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    for slider_id, value in SETTINGS.items():
        _set_slider(browser, slider_id, value)
        assert browser.find_element(By.ID, f"{slider_id}-value").text == value
    browser.find_element(By.ID, "seed").send_keys(str(SEED))
    browser.find_element(By.ID, "generate").click()
    output = browser.find_element(By.ID, "output")
    WebDriverWait(browser, WAIT_S).until(lambda _: output.get_attribute("data-state") in ("done", "error"))
    return output.get_attribute("data-state")


def _expected_rgb(p: float) -> tuple[int, int, int]:
    """The page's shading, hsl(round(120 p), 75%, 82%), as the RGB a browser computes."""
    r, g, b = colorsys.hls_to_rgb(round(120 * p) / 360, 0.82, 0.75)
    return round(r * 255), round(g * 255), round(b * 255)


def _tokens_shown(browser) -> list[list]:
    """The page's tokens: [data-token, text, data-logprob, computed background colour] of each."""
    return browser.execute_script(
        "return [...document.querySelectorAll('#output .token')].map(s =>"
        " [s.dataset.token, s.textContent, Number(s.dataset.logprob), getComputedStyle(s).backgroundColor])"
    )


def _reference_logprobs(server: Server) -> dict:
    """The page's request (same prompt, settings and seed) sent straight to /v1/completions: its logprobs."""
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": int(SETTINGS["max-tokens"]),
        "temperature": float(SETTINGS["temperature"]),
        "top_k": int(SETTINGS["top-k"]),
        "top_p": float(SETTINGS["top-p"]),
        "seed": SEED,
        "logprobs": 5,
    }
    reference = httpx.post(f"{server.base}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert reference.status_code == 200, reference.text
    return reference.json()["choices"][0]["logprobs"]


def _alternatives_on_hover(browser, index: int) -> list[list]:
    """Hover the page's ``index``-th token; its tooltip's rows: [data-token, data-logprob, percentage shown]."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    span = browser.find_elements(By.CSS_SELECTOR, "#output .token")[index]
    ActionChains(browser).move_to_element(span).perform()
    tooltip = browser.find_element(By.ID, "tooltip")
    WebDriverWait(browser, 10).until(lambda _: tooltip.is_displayed())
    return browser.execute_script(
        "return [...document.querySelectorAll('#tooltip .alternative')].map(r =>"
        " [r.dataset.token, Number(r.dataset.logprob), r.querySelector('.alt-p').textContent])"
    )


def _save_screenshot(browser, path: Path, copy_to_variable: str) -> None:
    """Save the page's screenshot at ``path``, and copy it where the environment variable says, if set
    (the docs' screenshots are taken this way)."""
    assert browser.save_screenshot(str(path))
    if os.environ.get(copy_to_variable):
        shutil.copyfile(path, os.environ[copy_to_variable])


def test_playground_streams_the_tokens_shaded_by_their_probabilities(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    state = _generate(browser, server, KEY)
    assert state == "done", browser.find_element(By.ID, "status").text
    shown = _tokens_shown(browser)
    logprobs = _reference_logprobs(server)
    assert len(shown) == len(logprobs["tokens"]) > 0
    for i, (token, text, logprob, background) in enumerate(shown):
        assert token == text == logprobs["tokens"][i]
        assert logprob == pytest.approx(logprobs["token_logprobs"][i], abs=1e-9)
        rgb = tuple(int(c) for c in re.findall(r"\d+", background)[:3])
        expected = _expected_rgb(math.exp(logprob))
        assert all(abs(a - b) <= 1 for a, b in zip(rgb, expected)), (i, background, expected)
    probabilities = [math.exp(lp) for lp in logprobs["token_logprobs"]]
    assert len(set(_expected_rgb(p) for p in probabilities)) > 1  # the shading varies
    mean = sum(probabilities) / len(probabilities)
    stat = browser.find_element(By.ID, "stat-mean")
    assert float(stat.get_attribute("data-value")) == pytest.approx(mean, rel=1e-9)
    assert stat.text == f"{mean:.3f}"
    assert browser.find_element(By.CSS_SELECTOR, "#history tbody td:last-child").text == f"{mean:.3f}"

    # Model and prompt text went in as text: the <b> of the prompt is shown, not made an element.
    echo = browser.execute_script("return document.getElementById('prompt-echo').textContent")
    assert echo == PROMPT
    assert not browser.find_elements(By.CSS_SELECTOR, "#output b, #output img, #output script")

    # Hover the least likely token: the tooltip lists the model's top alternatives and their probabilities.
    least = min(range(len(probabilities)), key=probabilities.__getitem__)
    rows = _alternatives_on_hover(browser, least)
    top = logprobs["top_logprobs"][least]
    assert {token for token, _, _ in rows} == set(top) and len(rows) == len(top) > 0
    for token, logprob, percent in rows:
        assert logprob == pytest.approx(top[token], abs=1e-9)
        assert float(percent.rstrip("%")) == pytest.approx(100 * math.exp(top[token]), abs=0.051)
    assert [lp for _, lp, _ in rows] == sorted((lp for _, lp, _ in rows), reverse=True)

    _save_screenshot(browser, tmp_path / "playground.png", "GPTKIT_PLAYGROUND_SCREENSHOT")


def test_playground_shows_the_servers_error(server, browser):
    from selenium.webdriver.common.by import By

    assert _generate(browser, server, "not-the-key") == "error"
    assert "Incorrect API key" in browser.find_element(By.ID, "status").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#output .token")


def _classify_in_page(browser, model: str, fields: dict[str, str]) -> list[list]:
    """Pick ``model`` in the classify view, fill in its fields, classify; the bars shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    Select(browser.find_element(By.ID, "task-model")).select_by_value(model)
    for name, text in fields.items():
        area = browser.find_element(By.ID, f"field-{name}")
        area.clear()
        area.send_keys(text)
    browser.find_element(By.ID, "classify-run").click()
    output = browser.find_element(By.ID, "classify-output")
    WebDriverWait(browser, WAIT_S).until(lambda _: output.get_attribute("data-state") in ("done", "error"))
    assert output.get_attribute("data-state") == "done", browser.find_element(By.ID, "classify-status").text
    return browser.execute_script(
        "return [...document.querySelectorAll('#classify-output .class-row')].map(r => [r.dataset.label,"
        " Number(r.dataset.prob), r.querySelector('.class-name').textContent, r.classList.contains('chosen'),"
        " r.querySelector('.bar').getBoundingClientRect().width / r.querySelector('.track').getBoundingClientRect().width])"
    )


def test_the_classify_view_shows_a_task_models_probabilities_as_bars(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server.base}/")
    browser.find_element(By.ID, "api-key").send_keys(KEY)
    browser.find_element(By.ID, "load-task-models").click()
    select = browser.find_element(By.ID, "task-model")
    WebDriverWait(browser, 30).until(lambda _: len(select.find_elements(By.TAG_NAME, "option")) == 2)
    # Fields by task kind: one text for a classifier; context, question and choices for multiple choice.
    cases = {
        "story": (
            {"context": "Alice went out.", "choices": "She came back.\nShe flew away."},
            {"context": "Alice went out.", "choices": ["She came back.", "She flew away."]},
        ),
        "sentiment": ({"text": "<b>A</b> fine film"}, {"text": "<b>A</b> fine film"}),
    }
    for model, (fields, row) in cases.items():
        shown = _classify_in_page(browser, model, fields)
        reference = httpx.post(
            f"{server.base}/v1/classify", json={"model": model, "input": [row]}, headers=AUTH, timeout=60
        )
        assert reference.status_code == 200, reference.text
        answer = reference.json()["data"][0]
        names = ["negative", "positive", "neutral"] if model == "sentiment" else row["choices"]
        assert [name for _, _, name, _, _ in shown] == names  # markup in the text stays text
        assert len({round(p, 3) for _, p, _, _, _ in shown}) == len(names) > 1
        for i, (label, p, _, chosen, width) in enumerate(shown):
            assert p == pytest.approx(answer["probs"][i], abs=1e-9)
            assert chosen == (label == answer["label"])
            assert width == pytest.approx(p, abs=0.02)  # the bar's length is the probability
    assert not browser.find_elements(By.CSS_SELECTOR, "#classify-output b")

    browser.execute_script("document.getElementById('classify-view').scrollIntoView()")
    _save_screenshot(browser, tmp_path / "classify.png", "GPTKIT_PLAYGROUND_CLASSIFY_SCREENSHOT")
