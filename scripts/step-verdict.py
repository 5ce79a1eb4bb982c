#!/usr/bin/env python3
"""The verdict of one step of the GPU scripts, from what the step printed.

  step-verdict.py go  OUTPUT RC [--skip NAME=WHY]...   a Go test binary run with -test.v
  step-verdict.py py  OUTPUT RC [--skip NAME=WHY]...   python3 -m unittest ... -v
  step-verdict.py sh  OUTPUT RC --count REGEX --min N  a script printing one line per check
  step-verdict.py bench LOG [FAILED_STEP]...           the summary of scripts/bench-gpu.sh
  step-verdict.py run KIND OUTPUT [ARGS...] -- CMD...  runs CMD (its output to stdout and to
                                                       OUTPUT), then judges it as KIND with ARGS;
                                                       the count line also goes to OUTPUT.verdict

A step passes only when its command exited 0, at least one test ran, none
failed, and every skip is named by a --skip NAME=WHY (a test's name, a
parent's name covering its subtests, or for Python the method name or the
dotted id): the reason that skip is expected where it runs. A skip named
there that did not happen is reported, not a failure (a second GPU, say).
Prints one line "ran N, passed P, skipped S (expected E)" then any reasons,
and exits 0 (PASSED) or 1 (FAILED), or 2 (SKIPPED) where no test passed and
every test skipped as the step expects: a step skipped whole is never
PASSED.

bench: every line of the log is read; the run fails on any step that
exited non-zero, any target or result line that says FAIL or MISS, and
any "not checked". "not measured here" passes.
"""

import re
import subprocess
import sys

GO_RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)")
PY_HEADER = re.compile(r"^(\w+) \(([\w.]+)\)", re.M)
PY_WORD = re.compile(r"^(ok|FAIL|ERROR|expected failure|unexpected success|skipped (['\"]).*\2)$")
PY_END = re.compile(r"^(={70}|-{70})$", re.M)
PY_RAN = re.compile(r"^Ran (\d+) tests? in", re.M)


def parse_skips(args):
    skips = {}
    for a in args:
        name, sep, why = a.partition("=")
        if not sep or not name or not why:
            raise SystemExit("--skip %r: want NAME=WHY" % a)
        skips[name] = why
    return skips


def go_results(text):
    """(name, PASS|FAIL|SKIP) for each test and subtest -test.v reported."""
    return [(m.group(2), m.group(1)) for m in map(GO_RESULT.match, text.splitlines()) if m]


def py_results(text):
    """(dotted name, PASS|FAIL|SKIP) for each test unittest -v reported.
    A test's line is "name (dotted) ... WORD", with the test's own output
    (logs on stderr) possibly between " ... " and WORD, which then starts
    a line of its own."""
    end = PY_END.search(text)
    body = text[:end.start()] if end else text
    heads = list(PY_HEADER.finditer(body))
    out = []
    for i, m in enumerate(heads):
        seg = body[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(body)]
        at = seg.find(" ... ")
        status = "FAIL"  # no result word: the run ended inside the test
        if at >= 0:
            first, _, rest = seg[at + 5:].partition("\n")
            for line in [first] + rest.split("\n"):
                w = PY_WORD.match(line.strip())
                if w:
                    word = w.group(1)
                    status = "SKIP" if word.startswith("skipped") else "PASS" if word in ("ok", "expected failure") else "FAIL"
                    break
        method, dotted = m.group(1), m.group(2)
        out.append((dotted if dotted.endswith("." + method) else dotted + "." + method, status))
    return out


def expected(name, skips, kind):
    for s in skips:
        if kind == "go" and (name == s or name.startswith(s + "/")):
            return s
        if kind == "py" and (name == s or name.endswith("." + s)):
            return s
    return None


def judge_tests(kind, text, rc, skips):
    """(ok, lines): the verdict of a Go or Python test step."""
    results = go_results(text) if kind == "go" else py_results(text)
    bad = []
    if kind == "go":
        # Count leaves only: a parent passes when its subtests skip.
        names = [n for n, _ in results]
        results = [(n, s) for n, s in results if not any(o.startswith(n + "/") for o in names)]
        if "testing: warning: no tests to run" in text:
            bad.append("no test matched the pattern")
    else:
        ran = PY_RAN.search(text)
        if ran is None:
            bad.append("unittest printed no 'Ran N tests' line")
        elif int(ran.group(1)) != len(results):
            bad.append("unittest ran %s tests; %d results read" % (ran.group(1), len(results)))
    passed = [n for n, s in results if s == "PASS"]
    failed = [n for n, s in results if s == "FAIL"]
    skipped = [n for n, s in results if s == "SKIP"]
    unexpected = [n for n in skipped if expected(n, skips, kind) is None]
    if rc != 0:
        bad.append("exit status %d" % rc)
    if not results:
        bad.append("no test ran")
    bad += ["failed: " + n for n in failed]
    bad += ["skipped without a reason named by the step: " + n for n in unexpected]
    lines = ["ran %d, passed %d, skipped %d (expected %d)" % (len(results), len(passed), len(skipped), len(skipped) - len(unexpected))]
    for n in skipped:
        s = expected(n, skips, kind)
        if s is not None:
            lines.append("expected skip: %s: %s" % (n, skips[s]))
    for s in skips:
        if not any(expected(n, {s: 1}, kind) for n in skipped):
            lines.append("note: the expected skip %s did not happen (it ran)" % s)
    if not bad and not passed:
        return SKIPPED, lines
    return not bad, lines + ["FAIL: " + b for b in bad]


def judge_script(text, rc, count, least):
    n = len(re.findall(count, text, re.M))
    fails = [l for l in text.splitlines() if re.match(r"^FAIL\b", l)]
    bad = ["exit status %d" % rc] if rc != 0 else []
    if n < least:
        bad.append("%d checks matched %r, want at least %d" % (n, count, least))
    bad += ["failed check: " + l for l in fails]
    return not bad, ["checks %d (want at least %d), failed %d" % (n, least, len(fails))] + ["FAIL: " + b for b in bad]


SKIPPED = "skipped"  # every test of the step skipped, each as the step expects

BENCH_BAD = re.compile(r"(^|[\s|:])(FAIL|MISS)([\s|:]|$)|not checked")


def judge_bench(text, failed_steps):
    bad = ["step failed: " + s for s in failed_steps]
    bad += ["line: " + l.strip() for l in text.splitlines() if BENCH_BAD.search(l)]
    targets = [l for l in text.splitlines() if re.match(r"^(target\s|\| target:)", l)]
    if not targets:
        bad.append("no target line in the log")
    return not bad, ["%d target lines, %d failures" % (len(targets), len(bad))] + ["FAIL: " + b for b in bad]


def run(argv):
    if "--" not in argv or len(argv) < 4:
        raise SystemExit("run KIND OUTPUT [ARGS...] -- CMD...")
    cut = argv.index("--")
    kind, output, args, cmd = argv[0], argv[1], argv[2:cut], argv[cut + 1:]
    with open(output, "wb") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in p.stdout:
            f.write(line)
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        rc = p.wait()
    code, lines = judge([kind, output, str(rc)] + args)
    with open(output + ".verdict", "w") as f:
        f.write(lines[0] + "\n")
    return code, lines


def judge(argv):
    kind = argv[0]
    with open(argv[1], errors="replace") as f:
        text = f.read()
    if kind == "bench":
        ok, lines = judge_bench(text, argv[2:])
    elif kind in ("go", "py"):
        rest = argv[3:]
        if len(rest) % 2 or any(a != "--skip" for a in rest[::2]):
            raise SystemExit("%s: after OUTPUT RC only --skip NAME=WHY pairs" % kind)
        ok, lines = judge_tests(kind, text, int(argv[2]), parse_skips(rest[1::2]))
    elif kind == "sh":
        if len(argv) != 7 or argv[3] != "--count" or argv[5] != "--min":
            raise SystemExit("sh OUTPUT RC --count REGEX --min N")
        ok, lines = judge_script(text, int(argv[2]), argv[4], int(argv[6]))
    else:
        raise SystemExit("unknown kind %r: go, py, sh or bench" % kind)
    if ok is SKIPPED:
        return 2, lines
    return (0 if ok else 1), lines


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    code, lines = run(argv[1:]) if argv[0] == "run" else judge(argv)
    for l in lines:
        print(l)
    print({0: "PASSED", 2: "SKIPPED"}.get(code, "FAILED"))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
