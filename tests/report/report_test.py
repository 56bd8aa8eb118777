#!/usr/bin/python3
"""report.html in a real browser (SPEC section 10): Debian's chromium, headless, with no
network at all (a new network namespace), loads the page of a real run and the test reads
the DOM the page's script left behind and a screenshot.

- the demo run (configs/demo.yaml): every panel present, the curves have as many points as
  metrics.csv has rows, the shard map has one tile per shard of the grid and halo bands,
  the screenshot is not blank (--screenshot FILE keeps it: docs/report.png is this one);
- the page references nothing outside itself;
- it renders with one rank, with one step, with val_* columns in metrics.csv, and after a
  resume (each step once in metrics.csv);
- the trainer has refreshed report.html at a checkpoint while the run still trains;
- `plan --html`: the plan panels alone;
- bad input: a directory that is not a run, a metrics.csv cut mid-line: exit 1, one message
  naming the file, no report.html (nor a temporary) left.

usage: report_test.py HALOTRAIN WORKDIR [--screenshot FILE]
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser

BIN, WORK = sys.argv[1], sys.argv[2]
SCREENSHOT = sys.argv[sys.argv.index("--screenshot") + 1] if "--screenshot" in sys.argv else None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = []
TIMEOUT = 120
RUN_PANELS = ["panel-loss", "panel-lr", "panel-speed", "panel-memory"]
PLAN_PANELS = ["panel-plan-memory", "panel-layer-memory", "panel-step-time", "panel-shards"]


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


def halotrain(*args, timeout=TIMEOUT):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=WORK)
    return r.returncode, r.stdout + r.stderr


def train(tag, *sets, config=None):
    run_dir = os.path.join(WORK, tag)
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["train", config or os.path.join(ROOT, "configs", "demo.yaml"), "--set", f"run_dir={run_dir}",
            "--set", f"name={tag}", "--set", "data.train=demo.h5"]
    for s in sets:
        args += ["--set", s]
    code, out = halotrain(*args)
    if code != 0:
        raise SystemExit(f"training {tag} failed (exit {code}):\n{out[-2000:]}")
    return run_dir


# Chromium as a test harness: headless, no sandbox (root), nothing that phones home, and no
# network: a network namespace of its own where this user may make one, else every host
# name resolving to nothing and every connection sent to a closed proxy port.
NO_NETWORK = (["unshare", "--net"] if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0
              else None)


def chromium(url, *flags):
    profile = tempfile.mkdtemp(prefix="chromium-", dir=WORK)
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=10000", *flags, url]
    if NO_NETWORK is None:
        cmd[1:1] = ["--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
    try:
        return subprocess.run((NO_NETWORK or []) + cmd, capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class Dom(HTMLParser):
    """The elements with an id, with their attributes, and the tags inside each panel."""

    def __init__(self):
        super().__init__()
        self.by_id, self.body, self.stack, self.tags = {}, {}, [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if "id" in a:
            self.by_id[a["id"]] = a
        for panel in self.stack:
            self.tags.setdefault(panel, []).append((tag, a))
        if tag == "section" and "id" in a:
            self.stack.append(a["id"])

    def handle_endtag(self, tag):
        if tag == "section" and self.stack:
            self.stack.pop()


def load_dom(page):
    r = chromium("file://" + page, "--dump-dom")
    dom = Dom()
    dom.feed(r.stdout)
    return dom, r


def points(dom, panel):
    return json.loads(dom.by_id.get(panel, {}).get("data-points", "null") or "null")


def metrics_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def grid_tiles(run_dir):
    with open(os.path.join(run_dir, "run.json")) as f:
        g = json.load(f)["grid"]
    return g[0] * g[1]


def page_problems(dom, r, panels):
    problems = []
    if dom.body.get("data-ready") != "1":
        problems.append(f"the page's script did not finish: {dom.body.get('data-error', '')} {r.stderr[-500:]}")
    problems += [f"no {p}" for p in panels if p not in dom.by_id]
    return problems


def check_run_page(name, run_dir):
    page = os.path.join(run_dir, "report.html")
    dom, r = load_dom(page)
    rows = metrics_rows(run_dir)
    val_columns = [c for c in (rows[0] if rows else {}) if c.startswith("val_")]
    problems = page_problems(dom, r, RUN_PANELS + PLAN_PANELS)
    loss = points(dom, "panel-loss") or []
    want = [len(rows)] + [sum(1 for row in rows if row[c] != "") for c in val_columns]
    if loss != want:
        problems.append(f"loss curves have {loss} points, metrics.csv {want}")
    for panel, n in (("panel-lr", 1), ("panel-speed", 2)):
        got = (points(dom, panel) or [])[:n]
        if got != [len(rows)] * n:
            problems.append(f"{panel} has {got} points, metrics.csv {len(rows)} rows")
    memory = points(dom, "panel-memory") or []
    ranks = json.load(open(os.path.join(run_dir, "run.json")))["world"]
    if memory != [ranks] * 3:
        problems.append(f"memory panel bars {memory}, expected measured, predicted, budget for {ranks} ranks")
    tiles = int(dom.by_id.get("panel-shards", {}).get("data-tiles", -1))
    if tiles != grid_tiles(run_dir):
        problems.append(f"shard map has {tiles} tiles, the grid {grid_tiles(run_dir)}")
    bands = int(dom.by_id.get("panel-shards", {}).get("data-halo-bands", -1))
    if (bands > 0) != (grid_tiles(run_dir) > 1):
        problems.append(f"{bands} halo bands for {grid_tiles(run_dir)} tiles")
    check(name, not problems, "; ".join(problems))
    return page


def screenshot_problems(png):
    from PIL import Image  # python3-pil

    img = Image.open(png).convert("RGB")
    w, h = img.size
    small = img.resize((w // 4, h // 4))
    pixels = list(small.getdata())
    background = max(set(pixels), key=pixels.count)
    other = sum(1 for p in pixels if p != background) / len(pixels)
    colors = len(set(pixels))
    if other < 0.2 or colors < 200:
        return [f"the screenshot looks blank: {100 * other:.0f}% not background, {colors} colours"]
    return []


def logged_rows(html):
    """The number of metrics.csv rows in a page's data block."""
    m = re.search(r'<script type="application/json" id="halotrain-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))["run"]["rows"] if m else -1


def external_references(page):
    """Anything the page could load from elsewhere. URLs inside the inlined libraries'
    /*! licence banners */ are text, not references, and are removed first."""
    with open(page) as f:
        text = re.sub(r"/\*!.*?\*/", "", f.read(), flags=re.S)
    found = re.findall(r"https?://[^\s\"'<>)]*", text)
    found += re.findall(r"\b(?:src|href)\s*=", text) + re.findall(r"url\(|@import|<link\b|<iframe\b", text)
    return found


def main():
    os.makedirs(WORK, exist_ok=True)
    # The demo, as `make run` trains it (its data synthesized here).
    demo = train("demo")
    page = os.path.join(demo, "report.html")
    check("the trainer wrote report.html at the end of the run", os.path.isfile(page))
    os.remove(page)
    code, out = halotrain("report", demo)
    check("halotrain report RUN_DIR: exit 0, report.html written", code == 0 and os.path.isfile(page), out[-800:])
    check_run_page("demo run: every panel, curve points = metrics.csv rows, tiles = grid", demo)
    check("the page references nothing outside itself", not external_references(page), external_references(page)[:5])
    shot = SCREENSHOT or os.path.join(WORK, "report.png")
    r = chromium("file://" + page, f"--screenshot={os.path.abspath(shot)}", "--window-size=1280,2240")
    problems = [f"no screenshot: {r.stderr[-500:]}"] if not os.path.isfile(shot) else screenshot_problems(shot)
    check("a screenshot of the demo report is not blank", not problems, "; ".join(problems))

    one_rank = train("one_rank", "parallel.grid=[1,1]", "training.steps=6")
    check_run_page("one rank: renders, one tile, no halo bands", one_rank)
    one_step = train("one_step", "training.steps=1", "checkpoint.every_steps=1")
    check_run_page("one step: renders, one point per curve", one_step)

    # A resumed run logs the steps after its checkpoint again: metrics.csv keeps each step
    # once (a crash's rows past the checkpoint and its cut last line are dropped).
    resumed = train("resumed", "training.steps=10", "checkpoint.every_steps=5", "training.log_every=1")
    os.remove(os.path.join(resumed, "checkpoints", "ckpt-10.h5"))
    with open(os.path.join(resumed, "metrics.csv"), "a") as f:
        f.write("11,0,0.6")
    code, out = halotrain("train", os.path.join(ROOT, "configs", "demo.yaml"), "--set", f"run_dir={resumed}",
                          "--set", "name=resumed", "--set", "data.train=demo.h5", "--set", "training.steps=10",
                          "--set", "checkpoint.every_steps=5", "--set", "training.log_every=1")
    steps = [int(r["step"]) for r in metrics_rows(resumed)]
    check("resume: metrics.csv holds every step once, in order", code == 0 and steps == list(range(1, 11)),
          f"exit {code} steps {steps} {out[-400:]}")
    check_run_page("resume: the page has one point per step", resumed)

    # The demo validates every 20 steps and logs every 10: its val_* columns (val_loss and
    # one per metric) are drawn beside the loss, their empty cells skipped.
    rows = metrics_rows(demo)
    val_columns = [c for c in rows[0] if c.startswith("val_")]
    filled = [sum(1 for row in rows if row[c] != "") for c in val_columns]
    check("validation columns in metrics.csv, filled on the validated rows only",
          val_columns[:2] == ["val_loss", "val_accuracy"] and all(0 < n < len(rows) for n in filled),
          f"columns {val_columns}, filled {filled} of {len(rows)}")

    # Refreshed at a checkpoint while the run trains: 400 demo steps take over a minute.
    live = os.path.join(WORK, "live")
    shutil.rmtree(live, ignore_errors=True)
    proc = subprocess.Popen([BIN, "train", os.path.join(ROOT, "configs", "demo.yaml"), "--set", f"run_dir={live}",
                             "--set", "data.train=demo.h5", "--set", "training.steps=400",
                             "--set", "checkpoint.every_steps=2"], cwd=WORK,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, seen, complete = time.time() + 90, False, True
    while time.time() < deadline and proc.poll() is None and not seen:
        time.sleep(0.2)
        if os.path.isfile(os.path.join(live, "report.html")):
            text = open(os.path.join(live, "report.html")).read()
            complete &= text.rstrip().endswith("</html>")  # never a half-written page
            seen = logged_rows(text) > 0  # the page of the start has none
    running = proc.poll() is None
    proc.terminate()
    proc.wait(timeout=60)
    check("report.html is rewritten at a checkpoint while the run still trains, always whole",
          seen and running and complete, f"seen {seen} running {running} complete {complete}")

    # plan --html: before anything runs.
    plan_page = os.path.join(WORK, "plan.html")
    code, out = halotrain("plan", os.path.join(ROOT, "configs", "demo.yaml"), "--set", "parallel.grid=[2,2]",
                          "--set", "data.train=demo.h5", "--html", plan_page)
    dom, r = load_dom(plan_page) if code == 0 else (Dom(), None)
    problems = page_problems(dom, r, PLAN_PANELS) if r else [f"exit {code}: {out[-500:]}"]
    problems += [f"{p} present in a plan page" for p in RUN_PANELS if p in dom.by_id]
    if int(dom.by_id.get("panel-shards", {}).get("data-tiles", -1)) != 4:
        problems.append(f"tiles {dom.by_id.get('panel-shards', {}).get('data-tiles')} for grid [2, 2]")
    check("plan --html: the plan panels alone, four tiles for grid [2, 2]", not problems, "; ".join(problems))

    # Bad input: one message, exit 1, no page left behind.
    empty = os.path.join(WORK, "not_a_run")
    shutil.rmtree(empty, ignore_errors=True)
    os.makedirs(empty)
    code, out = halotrain("report", empty)
    check("report on a directory that is not a run: exit 1 naming it and run.json, no report.html",
          code == 1 and empty in out and "run.json" in out and "internal" not in out and
          os.listdir(empty) == [], f"exit {code} {out[-600:]}")
    cut = os.path.join(WORK, "cut")
    shutil.rmtree(cut, ignore_errors=True)
    shutil.copytree(demo, cut)
    os.remove(os.path.join(cut, "report.html"))
    metrics = os.path.join(cut, "metrics.csv")
    text = open(metrics).read()
    with open(metrics, "w") as f:
        f.write(text[: text.rindex("\n", 0, len(text) - 1) + 12])  # the last row cut after 11 characters
    code, out = halotrain("report", cut)
    left = [f for f in os.listdir(cut) if f.startswith("report.html")]
    check("report on a metrics.csv cut mid-line: exit 1 naming the file and line, no report.html",
          code == 1 and "metrics.csv" in out and "mid-line" in out and not left, f"exit {code} {left} {out[-600:]}")

    print(f"{sum(RESULTS)} passed, {len(RESULTS) - sum(RESULTS)} failed")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
