// The gptkit playground: streams a completion with its log-probabilities and shades each token.
// Model text only ever reaches the page as textContent or an attribute value, never as HTML.
"use strict";

const TOP_ALTERNATIVES = 5; // logprobs asked for: the most the server returns
const HISTORY_ROWS = 8;

const $ = (id) => document.getElementById(id);
const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;

// Probability → background: hue from red (p = 0) through yellow to green (p = 1), light enough to
// read dark text on. The browser test recomputes this, so keep the two in step.
function shade(p) {
  const hue = Math.round(120 * Math.min(Math.max(p, 0), 1));
  return `hsl(${hue}, 75%, 82%)`;
}

function percent(p) {
  return `${(100 * p).toFixed(p < 0.01 ? 2 : 1)}%`;
}

// Whitespace made visible in the tooltip, where a bare space or newline would vanish.
function visible(token) {
  return token.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205";
}

const sliders = ["temperature", "top-k", "top-p", "max-tokens"];

function sliderText(id, value) {
  if (id === "top-k" && Number(value) === 0) return "off";
  if (id === "top-p" && Number(value) >= 1) return "off";
  if (id === "temperature" && Number(value) < 1e-5) return "0 (greedy)";
  return value;
}

function showSliders() {
  for (const id of sliders) $(`${id}-value`).textContent = sliderText(id, $(id).value);
}

function requestBody() {
  const body = {
    model: meta("gptkit-model"),
    prompt: $("prompt").value,
    max_tokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    stream: true,
    logprobs: TOP_ALTERNATIVES,
  };
  const topK = Number($("top-k").value);
  const topP = Number($("top-p").value);
  if (topK > 0) body.top_k = topK;
  if (topP < 1) body.top_p = topP;
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  return body;
}

class Run {
  constructor(body) {
    this.body = body;
    this.probabilities = [];
    this.output = $("output");
  }

  start() {
    this.output.replaceChildren();
    const echo = document.createElement("span");
    echo.className = "prompt-text";
    echo.id = "prompt-echo";
    echo.textContent = this.body.prompt;
    this.output.append(echo);
    this.output.dataset.state = "streaming";
    this.updateStats();
  }

  addToken(token, logprob, top) {
    const p = Math.exp(logprob);
    this.probabilities.push(p);
    const span = document.createElement("span");
    span.className = "token";
    span.textContent = token;
    span.dataset.token = token;
    span.dataset.logprob = String(logprob);
    span.dataset.index = String(this.probabilities.length - 1);
    span.style.backgroundColor = shade(p);
    span.alternatives = Object.entries(top || {}).sort((a, b) => b[1] - a[1]);
    this.output.append(span);
    this.updateStats();
  }

  mean() {
    const n = this.probabilities.length;
    return n ? this.probabilities.reduce((a, b) => a + b, 0) / n : null;
  }

  updateStats() {
    const n = this.probabilities.length;
    $("stat-tokens").textContent = String(n);
    const mean = this.mean();
    $("stat-mean").textContent = mean === null ? "–" : mean.toFixed(3);
    $("stat-mean").dataset.value = mean === null ? "" : String(mean);
    $("stat-min").textContent = n ? percent(Math.min(...this.probabilities)) : "–";
  }

  finish(state, message) {
    this.output.dataset.state = state;
    $("status").textContent = message;
    $("status").className = state === "error" ? "error" : "";
    if (this.probabilities.length) this.addHistory();
  }

  addHistory() {
    const row = document.createElement("tr");
    const b = this.body;
    const cells = [
      sliderText("temperature", String(b.temperature)),
      b.top_k === undefined ? "off" : String(b.top_k),
      b.top_p === undefined ? "off" : String(b.top_p),
      String(this.probabilities.length),
      this.mean().toFixed(3),
    ];
    for (const text of cells) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    const body = document.querySelector("#history tbody");
    body.prepend(row);
    while (body.rows.length > HISTORY_ROWS) body.deleteRow(-1);
  }
}

// Server-sent events: blocks separated by a blank line, each `data: ...` line one payload.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data) yield data;
    }
  }
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error && body.error.message ? body.error.message : `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

let controller = null;

async function generate() {
  if (controller) {
    controller.abort();
    return;
  }
  const body = requestBody();
  const run = new Run(body);
  run.start();
  $("status").textContent = "generating…";
  $("status").className = "";
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  controller = new AbortController();
  $("generate").textContent = "Stop";
  const started = performance.now();
  try {
    const response = await fetch("v1/completions", {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      run.finish("error", await errorMessage(response));
      return;
    }
    let finishReason = null;
    for await (const data of events(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        run.finish("error", chunk.error.message);
        return;
      }
      for (const choice of chunk.choices || []) {
        // The tokens of the logprobs are the text; choice.text repeats it (or holds back part of a
        // character until its last byte), so only the tokens are shown.
        const lp = choice.logprobs;
        if (lp && lp.tokens) {
          lp.tokens.forEach((token, i) => run.addToken(token, lp.token_logprobs[i], lp.top_logprobs[i]));
        }
        finishReason = choice.finish_reason || finishReason;
      }
    }
    const seconds = (performance.now() - started) / 1000;
    const why = finishReason === "stop" ? "end of text" : finishReason === "length" ? "max tokens" : "ended";
    const rate = (run.probabilities.length / seconds).toFixed(1);
    run.finish("done", `done (${why}), ${seconds.toFixed(1)} s, ${rate} tok/s`);
  } catch (error) {
    run.finish(error.name === "AbortError" ? "done" : "error", error.name === "AbortError" ? "stopped" : String(error));
  } finally {
    controller = null;
    $("generate").textContent = "Generate";
  }
}

function showTooltip(span) {
  const tip = $("tooltip");
  const p = Math.exp(Number(span.dataset.logprob));
  const head = document.createElement("div");
  head.className = "tip-head";
  const chosen = document.createElement("span");
  chosen.className = "alt-token";
  chosen.textContent = visible(span.dataset.token);
  head.append(chosen, document.createTextNode(` sampled, p = ${percent(p)}`));
  const list = document.createElement("table");
  for (const [token, logprob] of span.alternatives || []) {
    const row = list.insertRow();
    row.className = "alternative";
    row.dataset.token = token;
    row.dataset.logprob = String(logprob);
    const name = row.insertCell();
    name.className = "alt-token";
    name.textContent = visible(token);
    const bar = row.insertCell();
    const track = document.createElement("span");
    track.className = "track";
    const fill = document.createElement("span");
    fill.className = "bar";
    fill.style.width = `${Math.max(1, Math.round(100 * Math.exp(logprob)))}%`;
    fill.style.backgroundColor = shade(Math.exp(logprob));
    track.append(fill);
    bar.append(track);
    const prob = row.insertCell();
    prob.className = "alt-p";
    prob.textContent = percent(Math.exp(logprob));
  }
  const title = document.createElement("div");
  title.className = "tip-title";
  title.textContent = "top alternatives";
  tip.replaceChildren(head, title, list);
  tip.hidden = false;
  const box = span.getBoundingClientRect();
  const left = Math.min(box.left + window.scrollX, window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8);
  tip.style.left = `${Math.max(8, left)}px`;
  tip.style.top = `${box.bottom + window.scrollY + 6}px`;
}

// The classify view --------------------------------------------------------------------------------

// A task's input fields, as /v1/classify reads them: [field, label, rows]; "choices" is one per line.
const TASK_FIELDS = {
  classification: [["text", "text", 3]],
  entailment: [["premise", "premise", 3], ["hypothesis", "hypothesis", 2]],
  similarity: [["text_a", "first text", 2], ["text_b", "second text", 2]],
  multiple_choice: [["context", "context", 3], ["question", "question (optional)", 1], ["choices", "choices, one per line", 3]],
};

let taskModels = [];

function authHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function classifyStatus(message, isError) {
  $("classify-status").textContent = message;
  $("classify-status").className = isError ? "error" : "";
}

async function loadTaskModels() {
  const response = await fetch("v1/models", { headers: authHeaders() });
  if (!response.ok) {
    classifyStatus(await errorMessage(response), true);
    return;
  }
  taskModels = (await response.json()).data.filter((card) => card.task);
  const select = $("task-model");
  select.replaceChildren();
  for (const card of taskModels) {
    const option = document.createElement("option");
    option.value = card.id;
    option.textContent = `${card.id} (${card.task}${card.regression ? ", score" : ""})`;
    select.append(option);
  }
  select.disabled = $("classify-run").disabled = taskModels.length === 0;
  classifyStatus(taskModels.length ? `${taskModels.length} task model(s)` : "this server has no task models", false);
  showTaskFields();
}

function selectedTaskModel() {
  return taskModels.find((card) => card.id === $("task-model").value);
}

function showTaskFields() {
  const card = selectedTaskModel();
  const fields = [];
  for (const [name, label, rows] of card ? TASK_FIELDS[card.task] || [] : []) {
    const caption = document.createElement("label");
    caption.htmlFor = `field-${name}`;
    caption.textContent = label;
    const area = document.createElement("textarea");
    area.id = `field-${name}`;
    area.dataset.field = name;
    area.rows = rows;
    area.spellcheck = false;
    fields.push(caption, area);
  }
  $("task-fields").replaceChildren(...fields);
  $("classify-output").replaceChildren();
  $("classify-output").dataset.state = "idle";
}

function taskInput() {
  const input = {};
  for (const area of $("task-fields").querySelectorAll("textarea")) {
    const value = area.value.trim();
    if (area.dataset.field === "choices") input.choices = value.split("\n").map((c) => c.trim()).filter((c) => c);
    else if (value || area.dataset.field !== "question") input[area.dataset.field] = value;
  }
  return input;
}

// One bar per class (or choice), in the head's order; the most likely one in bold.
function showClasses(card, result) {
  const output = $("classify-output");
  if (card.regression) {
    const score = document.createElement("div");
    score.className = "score";
    score.dataset.score = String(result.score);
    score.textContent = `score ${Number(result.score).toFixed(3)}`;
    output.replaceChildren(score);
    return;
  }
  const names = card.task === "multiple_choice" ? taskInput().choices : card.labels;
  const rows = result.probs.map((p, i) => {
    const row = document.createElement("div");
    row.className = "class-row";
    row.dataset.label = card.task === "multiple_choice" ? String(i) : names[i];
    row.dataset.prob = String(p);
    if (row.dataset.label === String(result.label)) row.classList.add("chosen");
    const name = document.createElement("span");
    name.className = "class-name";
    name.textContent = names[i];
    const track = document.createElement("span");
    track.className = "track";
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${(100 * p).toFixed(2)}%`;
    bar.style.backgroundColor = shade(p);
    track.append(bar);
    const prob = document.createElement("span");
    prob.className = "class-p";
    prob.textContent = percent(p);
    row.append(name, track, prob);
    return row;
  });
  output.replaceChildren(...rows);
}

async function classify() {
  const card = selectedTaskModel();
  if (!card) return;
  const output = $("classify-output");
  output.dataset.state = "running";
  classifyStatus("classifying…", false);
  try {
    const response = await fetch("v1/classify", {
      method: "POST",
      headers: authHeaders(),
      body: JSON.stringify({ model: card.id, input: [taskInput()] }),
    });
    if (!response.ok) {
      output.replaceChildren();
      output.dataset.state = "error";
      classifyStatus(await errorMessage(response), true);
      return;
    }
    showClasses(card, (await response.json()).data[0]);
    output.dataset.state = "done";
    classifyStatus("done", false);
  } catch (error) {
    output.dataset.state = "error";
    classifyStatus(String(error), true);
  }
}

function init() {
  $("model-name").textContent = meta("gptkit-model");
  const maxTokens = Number(meta("gptkit-max-tokens"));
  if (maxTokens > 0) {
    $("max-tokens").max = String(Math.min(maxTokens, 1024));
    if (Number($("max-tokens").value) > maxTokens) $("max-tokens").value = String(maxTokens);
  }
  $("api-key-field").hidden = meta("gptkit-api-key") !== "required";
  for (const id of sliders) $(id).addEventListener("input", showSliders);
  showSliders();
  $("generate").addEventListener("click", generate);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) generate();
  });
  const output = $("output");
  output.addEventListener("mouseover", (event) => {
    if (event.target.classList.contains("token")) showTooltip(event.target);
  });
  output.addEventListener("mouseout", (event) => {
    if (event.target.classList.contains("token")) $("tooltip").hidden = true;
  });
  $("load-task-models").addEventListener("click", loadTaskModels);
  $("task-model").addEventListener("change", showTaskFields);
  $("classify-run").addEventListener("click", classify);
}

document.addEventListener("DOMContentLoaded", init);
