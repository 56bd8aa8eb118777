#!/usr/bin/python3
"""The source tree's includes depend one way.

- No include cycle between files: a file's component is its name without the extension
  (x.hpp and x.cpp together); a cycle is a set of components that reach each other
  through #include "..." lines. Tests are left out.
- The worker's libraries (worker/CMakeLists.txt) include only those below them:
  io -> (orchestrator); runtime -> (orchestrator, kernels); comm -> runtime;
  layers -> comm, runtime; run -> everything above.
- The orchestrator, kernels and report include nothing of the worker, importer or CLI.

usage: include_layout_test.py [HALOTRAIN]  (the argument is ignored)
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FOLDERS = ("cli", "importer", "kernels", "orchestrator", "report", "worker")
# What each worker library may include from the worker.
WORKER_BELOW = {"io": set(), "runtime": set(), "comm": {"runtime"}, "layers": {"comm", "runtime"},
                "run": {"io", "runtime", "comm", "layers"}}


def sources():
    for top in FOLDERS:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".cpp", ".hpp", ".cu", ".cuh")):
                    path = os.path.join(d, f)
                    yield os.path.relpath(path, ROOT).replace(os.sep, "/"), path


def component(path):
    return os.path.splitext(path)[0]


def main():
    graph, problems = {}, []
    for rel, path in sources():
        with open(path, encoding="utf-8", errors="replace") as f:
            includes = re.findall(r'^#include "([^"]+)"', f.read(), re.M)
        c = component(rel)
        for inc in includes:
            if component(inc) != c:
                graph.setdefault(c, set()).add(component(inc))
            top, inc_top = rel.split("/")[0], inc.split("/")[0]
            if top in ("orchestrator", "kernels", "report") and inc_top in ("worker", "importer", "cli"):
                problems.append(f"{rel} includes {inc}: {top} is below the {inc_top}")
            if top == "worker" and inc_top == "worker":
                mine, theirs = rel.split("/")[1], inc.split("/")[1]
                if mine in WORKER_BELOW and theirs != mine and theirs not in WORKER_BELOW[mine]:
                    problems.append(f"{rel} includes {inc}: worker/{mine} may include only "
                                    f"{sorted(WORKER_BELOW[mine]) or 'none of the worker'}")
    # Tarjan's strongly connected components.
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                cycles.append(sorted(scc))

    for v in list(graph):
        if v not in index:
            visit(v)
    problems += [f"include cycle: {' <-> '.join(c)}" for c in cycles]
    files = sum(1 for _ in sources())
    for p in problems:
        print("FAIL", p)
    print(f"{files} files, {len(graph)} components with includes: "
          f"{'one way' if not problems else str(len(problems)) + ' problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
