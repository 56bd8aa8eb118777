// Glue between the run's data (the JSON block above) and Chart.js; the shard map is an
// SVG over the thumbnail. Every panel records what it drew in data-* attributes
// (data-points: the points Chart.js laid out per dataset; data-tiles: the tiles drawn), so a
// test can check the page against metrics.csv and the plan.
(function () {
  "use strict";
  const doc = JSON.parse(document.getElementById("halotrain-data").textContent);
  const plan = doc.plan;
  const run = doc.run || null;
  const MiB = 1048576;
  const colors = ["#2f6fdf", "#e8702a", "#3aa657", "#c43c5c", "#8a5cc2", "#8c6d31", "#1aa3a3", "#6b7280"];
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.font.size = 12;

  const panel = (id) => document.getElementById(id);
  const note = (id, text) => { panel(id).querySelector(".note").textContent = text; };
  const mib = (bytes) => bytes / MiB;
  const fmtMiB = (bytes) => (bytes / MiB).toFixed(1) + " MiB";
  const seconds = (s) => (s >= 1 ? s.toFixed(2) + " s" : s >= 1e-3 ? (s * 1e3).toFixed(1) + " ms" : (s * 1e6).toFixed(0) + " us");

  function chart(id, config) {
    const c = new Chart(panel(id).querySelector("canvas"), config);
    panel(id).dataset.points = JSON.stringify(c.data.datasets.map((_, i) => c.getDatasetMeta(i).data.length));
    return c;
  }

  // [{x: step, y: value}] for one metrics.csv column, skipping empty cells.
  function series(name) {
    const steps = run.columns.step, values = run.columns[name] || [];
    const out = [];
    for (let i = 0; i < steps.length; ++i) if (values[i] !== null && values[i] !== undefined) out.push({ x: steps[i], y: values[i] });
    return out;
  }
  function line(label, data, i, extra) {
    return Object.assign({ label, data, borderColor: colors[i % colors.length], backgroundColor: colors[i % colors.length],
                           borderWidth: 2, pointRadius: data.length > 60 ? 0 : 2, spanGaps: true }, extra || {});
  }
  const stepAxis = { type: "linear", title: { display: true, text: "step" } };

  function header() {
    document.getElementById("title").textContent = (run ? "halotrain report: " : "halotrain plan: ") + doc.name;
    const parts = [`grid [${plan.grid[0]}, ${plan.grid[1]}]`, `${plan.world} rank${plan.world === 1 ? "" : "s"}`,
                   `image ${plan.image.height} x ${plan.image.width} x ${plan.image.channels}`, `batch ${plan.batch_size}`,
                   `backend ${plan.backend}`, `budget ${fmtMiB(plan.device_memory)} per device`,
                   plan.fits ? "plan fits" : "plan DOES NOT FIT"];
    if (run) {
      const steps = run.columns.step, loss = run.columns.loss;
      const last = loss[loss.length - 1];
      parts.unshift(steps.length ? `step ${steps[steps.length - 1]} of ${run.total_steps}, loss ${last === null ? "not finite" : Number(last).toFixed(4)}`
                                 : `no step logged yet (of ${run.total_steps})`);
      parts.push(...(run.notes || []));
    }
    document.getElementById("summary").textContent = parts.join(" \u00b7 ") + ` \u00b7 written ${doc.generated}`;
  }

  function lossPanel() {
    const names = ["loss"].concat(Object.keys(run.columns).filter((c) => c.startsWith("val_")));
    chart("panel-loss", { type: "line", data: { datasets: names.map((n, i) => line(n, series(n), i)) },
                          options: { parsing: false, scales: { x: stepAxis, y: { title: { display: true, text: "value" } } } } });
  }

  function lrPanel() {
    chart("panel-lr", { type: "line", data: { datasets: [line("lr", series("lr"), 4)] },
                        options: { parsing: false, scales: { x: stepAxis, y: { title: { display: true, text: "learning rate" } } } } });
  }

  function speedPanel() {
    const predicted = plan.step_time.seconds;
    const steps = run.columns.step;
    const flat = steps.length ? [{ x: steps[0], y: predicted }, { x: steps[steps.length - 1], y: predicted }] : [];
    chart("panel-speed", {
      type: "line",
      data: { datasets: [line("images/s", series("images_per_s"), 0, { yAxisID: "ips" }),
                         line("step seconds", series("seconds"), 1, { yAxisID: "sec" }),
                         line("predicted step seconds", flat, 1, { yAxisID: "sec", borderDash: [6, 4], pointRadius: 0 })] },
      options: { parsing: false, scales: { x: stepAxis,
                 ips: { position: "left", title: { display: true, text: "images/s" } },
                 sec: { position: "right", title: { display: true, text: "seconds per step" }, grid: { drawOnChartArea: false } } } },
    });
  }

  function memoryPanel() {
    const ranks = plan.ranks.map((r) => "rank " + r.rank);
    const predicted = plan.ranks.map((r) => mib(r.peak_device_bytes));
    const datasets = [];
    let text;
    if (run.memory.length) {
      const measured = new Map(run.memory.map((m) => [m.rank, mib(m.peak_device_bytes)]));
      datasets.push({ type: "bar", label: "measured peak", data: plan.ranks.map((r) => (measured.has(r.rank) ? measured.get(r.rank) : null)),
                      backgroundColor: colors[0] });
      const worst = Math.max(...run.memory.map((m) => Math.abs(m.peak_device_bytes - m.predicted_peak_device_bytes) / Math.max(m.predicted_peak_device_bytes, 1)));
      text = `measured within ${(100 * worst).toFixed(1)}% of the memory model (run_dir/memory.csv)`;
    } else {
      const peaks = series("peak_device_bytes");
      const so_far = peaks.length ? Math.max(...peaks.map((p) => p.y)) : 0;
      text = `per-rank peaks are written at the end of a run (memory.csv); so far the largest over all ranks is ${fmtMiB(so_far)}`;
    }
    datasets.push({ type: "bar", label: "predicted peak", data: predicted, backgroundColor: colors[1] });
    datasets.push({ type: "bar", label: "budget (parallel.device_memory)", data: ranks.map(() => mib(plan.device_memory)),
                    backgroundColor: "rgba(196, 60, 92, 0.25)", borderColor: colors[3], borderWidth: 1 });
    chart("panel-memory", { data: { labels: ranks, datasets }, options: { scales: { y: { beginAtZero: true, title: { display: true, text: "MiB" } } } } });
    note("panel-memory", text);
  }

  function planMemoryPanel() {
    const kinds = ["params", "grads", "optimizer", "input", "activations", "transient", "halo", "workspace"];
    const ranks = plan.ranks.map((r) => "rank " + r.rank);
    const datasets = kinds.map((k, i) => ({ type: "bar", label: k, data: plan.ranks.map((r) => mib(r.memory[k])),
                                            backgroundColor: colors[i % colors.length], stack: "peak" }));
    datasets.push({ type: "bar", label: "budget", data: ranks.map(() => mib(plan.device_memory)), stack: "budget",
                    backgroundColor: "rgba(196, 60, 92, 0.25)", borderColor: colors[3], borderWidth: 1 });
    chart("panel-plan-memory", { data: { labels: ranks, datasets },
                                 options: { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, title: { display: true, text: "MiB" } } } } });
  }

  function layerMemoryPanel() {
    const layers = plan.layer_memory.layers;
    const kinds = [["weights + grads + optimizer", (l) => l.params + l.grads + l.optimizer, "device"],
                   ["activations kept for backward", (l) => l.activations, "device"],
                   ["halo staging", (l) => l.halo, "device"],
                   ["gradients during its backward", (l) => l.transient, "device"],
                   ["offloaded to the host pool", (l) => l.offloaded, "host"]];
    chart("panel-layer-memory", {
      type: "bar",
      data: { labels: layers.map((l) => `${l.name} (${l.policy})`),
              datasets: kinds.map(([label, f, stack], i) => ({ label, data: layers.map((l) => mib(f(l))), stack,
                                                               backgroundColor: colors[i % colors.length] })) },
      options: { scales: { x: { stacked: true, ticks: { autoSkip: false, maxRotation: 60 } },
                           y: { stacked: true, beginAtZero: true, title: { display: true, text: "MiB" } } } },
    });
    note("panel-layer-memory", `rank ${plan.layer_memory.rank} (the busiest); sizes each layer holds at some time of the step, not one moment: ` +
         "the peak is the panel above");
  }

  function stepTimePanel() {
    const t = plan.step_time;
    const parts = ["compute", "recompute", "halo", "allreduce", "offload"];
    const labels = ["predicted"];
    let measured = null;
    if (run && run.columns.seconds && run.columns.seconds.length) {
      const s = run.columns.seconds.filter((v) => v !== null).slice().sort((a, b) => a - b);
      measured = s[Math.floor(s.length / 2)];
      labels.push("measured (median)");
    }
    const datasets = parts.map((p, i) => ({ label: p, data: [t[p]], backgroundColor: colors[i % colors.length], stack: "t" }));
    if (measured !== null) datasets.push({ label: "measured step", data: [null, measured], backgroundColor: colors[7], stack: "t" });
    chart("panel-step-time", { type: "bar", data: { labels, datasets },
                               options: { indexAxis: "y", scales: { x: { stacked: true, title: { display: true, text: "seconds" } }, y: { stacked: true } } } });
    note("panel-step-time", `predicted ${seconds(t.seconds)} per step on one ${t.device} per rank` +
         (measured !== null ? `; measured median ${seconds(measured)}` : ""));
  }

  function shardPanel() {
    const map = plan.shard_map, image = doc.image;
    const scale = Math.min(640 / Math.max(map.height, map.width), 4);  // display pixels per image pixel
    const W = Math.round(map.width * scale), H = Math.round(map.height * scale);
    const canvas = document.getElementById("shard-image");
    canvas.style.width = W + "px";
    canvas.style.height = H + "px";
    const ctx = canvas.getContext("2d");
    let source;
    if (image.pixels) {
      canvas.width = image.width;
      canvas.height = image.height;
      const bytes = atob(image.pixels);
      const rgba = ctx.createImageData(image.width, image.height);
      for (let i = 0; i < bytes.length; ++i) {
        const v = bytes.charCodeAt(i);
        rgba.data[4 * i] = rgba.data[4 * i + 1] = rgba.data[4 * i + 2] = v;
        rgba.data[4 * i + 3] = 255;
      }
      ctx.putImageData(rgba, 0, 0);
      source = `${image.source}, box-averaged ${image.factor} x ${image.factor} to ${image.width} x ${image.height}`;
    } else {
      canvas.width = W;
      canvas.height = H;
      ctx.fillStyle = "#333";
      ctx.fillRect(0, 0, W, H);
      source = `no image: ${image.missing}`;
    }
    const svg = document.getElementById("shard-svg");
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    const NS = svg.namespaceURI;
    const el = (name, attrs, text) => {
      const e = document.createElementNS(NS, name);
      for (const k in attrs) e.setAttribute(k, attrs[k]);
      if (text !== undefined) e.textContent = text;
      return svg.appendChild(e);
    };
    const select = document.getElementById("halo-layer");
    // The widest halo of a layer, in image pixels: the layer's halo rows times the image
    // pixels per row of its input.
    const widest = (layer) => {
      const sy = map.height / layer.height, sx = map.width / layer.width;
      let w = 0;
      layer.ranks.forEach((r) => {
        w = Math.max(w, (r.owned[0] - r.needed[0]) * sy, (r.needed[1] - r.owned[1]) * sy,
                     (r.owned[2] - r.needed[2]) * sx, (r.needed[3] - r.owned[3]) * sx);
      });
      return w;
    };
    let best = 0;
    map.layers.forEach((layer, i) => {
      const o = document.createElement("option");
      o.value = i;
      o.textContent = `${layer.name} (input ${layer.height} x ${layer.width}, halo up to ${widest(layer).toFixed(0)} image px)`;
      select.appendChild(o);
      if (widest(layer) > widest(map.layers[best])) best = i;
    });
    select.value = best;

    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const layer = map.layers[Number(select.value)];
      if (layer) {
        const sy = (map.height / layer.height) * scale, sx = (map.width / layer.width) * scale;
        const min = 3;  // display pixels: a one-row halo of a huge image stays visible
        const band = (y0, y1, x0, x1) => {
          if (y1 <= y0 || x1 <= x0) return;
          const h = Math.max(y1 - y0, min), w = Math.max(x1 - x0, min);
          el("rect", { class: "halo", x: x0, y: y0, width: w, height: h });
        };
        layer.ranks.forEach((r) => {
          const [o0, o1, p0, p1] = r.owned, [n0, n1, q0, q1] = r.needed;
          band(n0 * sy, o0 * sy, q0 * sx, q1 * sx);                                  // above
          band(o1 * sy, n1 * sy, q0 * sx, q1 * sx);                                  // below
          band(o0 * sy, o1 * sy, q0 * sx, p0 * sx);                                  // left
          band(o0 * sy, o1 * sy, p1 * sx, q1 * sx);                                  // right
        });
      }
      map.tiles.forEach((t) => {
        const [r0, r1, c0, c1] = t.owned;
        el("rect", { class: "tile", "data-rank": t.rank, x: c0 * scale, y: r0 * scale, width: (c1 - c0) * scale, height: (r1 - r0) * scale });
        el("text", { class: "tile-label", x: c0 * scale + 6, y: r0 * scale + 18 }, `rank ${t.rank}: ${r1 - r0} x ${c1 - c0}`);
      });
      panel("panel-shards").dataset.tiles = svg.querySelectorAll(".tile").length;
      panel("panel-shards").dataset.haloBands = svg.querySelectorAll(".halo").length;
      note("panel-shards", `${source}. Yellow: each shard's tile of the image (sample groups repeat it); red: the rows and ` +
           `columns ${layer ? layer.name : "a layer"} reads from its neighbours, drawn at least 3 px wide.` +
           (map.layers.length ? "" : " No windowed layers: nothing is exchanged."));
    }
    select.addEventListener("change", draw);
    if (!map.layers.length) select.parentElement.parentElement.style.display = "none";
    draw();
  }

  try {
    header();
    if (run) {
      lossPanel();
      lrPanel();
      speedPanel();
      memoryPanel();
    } else {
      document.querySelectorAll(".run-only").forEach((p) => p.remove());
    }
    planMemoryPanel();
    layerMemoryPanel();
    stepTimePanel();
    shardPanel();
    document.body.dataset.ready = "1";
  } catch (e) {
    document.body.dataset.error = String(e && e.stack || e);
    throw e;
  }
})();
