// The page: a model folder laid out as a hub repo (config.json, preprocessor_config.json, onnx/model_elastic.onnx;
// ?model=FOLDER, default "model"), its elastic graph run by onnxruntime-web on an image at the slider's budget, the
// patch features shown as RGB and the latency of each call. `window.corevision.run(budget)` is what the slider calls.
// Until a file is picked, the page runs on a shipped photo (SAMPLE, served by web/serve.py), cropped to whole patches.
import * as ort from "./node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
import { keptForRatio } from "./budget.js";

const IMAGENET_MEAN = [0.485, 0.456, 0.406];
const IMAGENET_STD = [0.229, 0.224, 0.225];
const PCA_ITERATIONS = 30;
const SAMPLE = "sample.jpg";
const folder = new URLSearchParams(location.search).get("model") ?? "model";
const $ = (id) => document.getElementById(id);

const state = { model: null, image: null, latencies: new Map(), queue: Promise.resolve() };

async function fetchJSON(url, optional = false) {
  const response = await fetch(url);
  if (response.ok) return response.json();
  if (optional) return {};
  throw new Error(`${url}: ${response.status} ${response.statusText}`);
}

async function loadModel() {
  const config = await fetchJSON(`${folder}/config.json`);
  const processor = await fetchJSON(`${folder}/preprocessor_config.json`, true);
  const session = await ort.InferenceSession.create(`${folder}/onnx/model_elastic.onnx`, { executionProviders: ["wasm"] });
  const input = session.inputNames.find((name) => name !== "pixel_values");
  if (!input) throw new Error(`${folder}/onnx/model_elastic.onnx has no budget input: export it with --elastic.`);
  const model = {
    config, session, input, patch: config.patch_size,
    mean: processor.image_mean ?? IMAGENET_MEAN, std: processor.image_std ?? IMAGENET_STD,
  };
  const bank = config.model_type === "veca" ? `a bank of ${config.num_cores} cores` : `${config.num_fill_neighbors}+ kept patches`;
  $("model").textContent = `${folder}: ${config.model_type}, patch ${model.patch}, ${bank}; the graph's budget input is ${input}.`;
  $("budget-name").textContent = input;
  return model;
}

// The slider's range for this model and image: num_cores 1..bank; k from num_fill_neighbors to all patches; k_ratio
// from the fraction that keeps num_fill_neighbors patches to 1; k_mass, the share of the selector's softmax mass each
// image keeps (the graph keeps at least num_fill_neighbors slots, unused ones weightless), 0.01 to 1.
function budgetRange(model, patches) {
  const fewest = model.config.num_fill_neighbors;
  if (model.input === "num_cores") return { min: 1, max: model.config.num_cores, step: 1, value: model.config.num_cores };
  if (model.input === "k") {
    return { min: fewest, max: patches, step: 1, value: Math.max(fewest, keptForRatio(model.config.k_ratio, patches)) };
  }
  if (model.input === "k_mass") return { min: 0.01, max: 1, step: 0.01, value: model.config.default_k_mass ?? 0.5 };
  const min = Math.ceil((100 * fewest) / patches) / 100;
  return { min, max: 1, step: 0.01, value: Math.max(min, model.config.k_ratio) };
}

function budgetTensor(name, value) {
  return name === "k_ratio" || name === "k_mass" ? new ort.Tensor("float64", Float64Array.of(value), [])
    : new ort.Tensor("int64", BigInt64Array.of(BigInt(value)), []);
}

// The image as the graph takes it: (1, 3, H, W) float32, rescaled to [0, 1] and normalised with the processor's mean
// and std, at its own size; a side that is not a multiple of the patch size is refused here, but for the sample
// photo (`crop`), whose centre is cropped to whole patches.
async function loadImage(model, file, crop = false) {
  const bitmap = await createImageBitmap(file, { colorSpaceConversion: "none", premultiplyAlpha: "none" });
  const patch = model.patch;
  const fit = (side) => Math.max(patch, Math.floor(side / patch) * patch);
  const [width, height] = crop ? [fit(bitmap.width), fit(bitmap.height)] : [bitmap.width, bitmap.height];
  if (width % patch || height % patch) {
    throw new Error(`This image is ${width}x${height} px; the graph takes sides that are multiples of the ${patch} px `
      + `patch: crop or resize it to ${fit(width)}x${fit(height)} px.`);
  }
  const canvas = $("photo");
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  context.drawImage(bitmap, -Math.floor((bitmap.width - width) / 2), -Math.floor((bitmap.height - height) / 2));
  const rgba = context.getImageData(0, 0, width, height).data;
  const pixels = new Float32Array(3 * width * height);
  for (let c = 0; c < 3; c++) {
    for (let i = 0; i < width * height; i++) {
      pixels[c * width * height + i] = (rgba[4 * i + c] / 255 - model.mean[c]) / model.std[c];
    }
  }
  return { width, height, pixels, grid: [height / patch, width / patch] };
}

// The first three principal components of (n, d) features by subspace iteration, each scaled to 0..255: RGBA bytes.
function pcaColors(features, n, d) {
  const x = new Float64Array(n * d);
  for (let j = 0; j < d; j++) {
    let mean = 0;
    for (let i = 0; i < n; i++) mean += features[i * d + j] / n;
    for (let i = 0; i < n; i++) x[i * d + j] = features[i * d + j] - mean;
  }
  const project = (v) => {  // X v: (n,)
    const scores = new Float64Array(n);
    for (let i = 0; i < n; i++) for (let j = 0; j < d; j++) scores[i] += x[i * d + j] * v[j];
    return scores;
  };
  let basis = [0, 1, 2].map((k) => Float64Array.from({ length: d }, (_, j) => Math.sin(1 + j * (k + 1))));
  for (let iteration = 0; iteration < PCA_ITERATIONS; iteration++) {
    basis = basis.map((v) => {  // X^T X v
      const scores = project(v);
      const next = new Float64Array(d);
      for (let i = 0; i < n; i++) for (let j = 0; j < d; j++) next[j] += scores[i] * x[i * d + j];
      return next;
    });
    for (let k = 0; k < 3; k++) {  // Gram-Schmidt
      for (let l = 0; l < k; l++) {
        const dot = basis[k].reduce((sum, value, j) => sum + value * basis[l][j], 0);
        basis[k] = basis[k].map((value, j) => value - dot * basis[l][j]);
      }
      const norm = Math.hypot(...basis[k]) || 1;
      basis[k] = basis[k].map((value) => value / norm);
    }
  }
  const rgba = new Uint8ClampedArray(4 * n).fill(255);
  basis.forEach((v, k) => {
    const scores = project(v);
    const low = Math.min(...scores), high = Math.max(...scores);
    scores.forEach((s, i) => { rgba[4 * i + k] = (255 * (s - low)) / (high - low || 1); });
  });
  return rgba;
}

function drawFeatures(image, features, dim) {
  const [rows, columns] = image.grid;
  const grid = document.createElement("canvas");
  grid.width = columns;
  grid.height = rows;
  grid.getContext("2d").putImageData(new ImageData(pcaColors(features, rows * columns, dim), columns, rows), 0, 0);
  const canvas = $("features");
  canvas.width = image.width;
  canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.imageSmoothingEnabled = false;
  context.drawImage(grid, 0, 0, image.width, image.height);
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

// One call of the graph at `budget` on the current image: draws the features and the latency; returns
// {budget, ms, tokens, features (the patch tokens, row-major on the grid, flattened)}.
async function runOnce(budget) {
  const { model, image } = state;
  if (!image) throw new Error("Choose an image first.");
  const feeds = {
    pixel_values: new ort.Tensor("float32", image.pixels, [1, 3, image.height, image.width]),
    [model.input]: budgetTensor(model.input, budget),
  };
  const start = performance.now();
  const outputs = await model.session.run(feeds);
  const ms = performance.now() - start;
  const [, tokens, dim] = outputs.last_hidden_state.dims;
  const cells = image.grid[0] * image.grid[1];
  const features = outputs.last_hidden_state.data.subarray((tokens - cells) * dim);  // the patch tokens come last
  drawFeatures(image, features, dim);
  const times = state.latencies.get(budget) ?? [];
  times.push(ms);
  state.latencies.set(budget, times);
  $("budget").value = budget;
  $("budget-value").textContent = `${budget}`;
  $("latency").textContent = `${ms.toFixed(1)} ms this call; median ${median(times).toFixed(1)} ms of ${times.length} `
    + `call${times.length > 1 ? "s" : ""} at ${model.input}=${budget} (${image.width}x${image.height} px, `
    + `${tokens} tokens out)`;
  $("error").textContent = "";
  return { budget, ms, tokens, features: Array.from(features) };
}

function showing(promise) {
  return promise.catch((error) => {
    $("error").textContent = error.message ?? String(error);
    throw error;
  });
}

// Calls run one at a time, in order: a session runs one call at a time.
function run(budget) {
  const result = state.queue.then(() => runOnce(budget));
  state.queue = result.catch(() => {});
  return showing(result);
}

// Shows `file` (the sample photo, cropped, with `name`) and runs it at the slider's default budget for it.
async function chooseImage(file, name = file.name, crop = false) {
  state.image = null;
  state.latencies.clear();
  state.image = await loadImage(state.model, file, crop);
  $("image-name").textContent = `${name}: ${state.image.width}x${state.image.height} px`;
  const range = budgetRange(state.model, state.image.grid[0] * state.image.grid[1]);
  Object.assign($("budget"), range, { disabled: false });
  $("budget-value").textContent = `${range.value}`;
  return run(range.value);
}

async function showSample() {
  const response = await fetch(SAMPLE);
  if (!response.ok) throw new Error(`${SAMPLE}: ${response.status} ${response.statusText}`);
  return chooseImage(await response.blob(), `The sample photo (${SAMPLE}, cropped to whole patches; choose your own above)`, true);
}

const ready = showing(loadModel().then((model) => { state.model = model; return model.input; }));
state.sample = showing(ready.then(showSample));
state.sample.catch(() => {});
$("image").addEventListener("change", (event) => {
  state.chosen = showing(state.sample.catch(() => {}).then(() => chooseImage(event.target.files[0])));
  state.chosen.catch(() => {});
});
$("budget").addEventListener("input", (event) => { $("budget-value").textContent = event.target.value; });
$("budget").addEventListener("change", (event) => { run(Number(event.target.value)).catch(() => {}); });

window.corevision = { ready, run, state };
