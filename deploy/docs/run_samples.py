"""Runs the samples of the documentation's tested pages against a live Railhook.

Usage: run_samples.py [--fresh-project] [--guides-from SUMMARY.md] [PAGE.md...]

A tested page is read as a reader would follow it: its `sh` blocks run in order in one bash
(so a variable set in one block is there in the next), in a scratch directory of its own; a
block whose info string names a file (```python file=receiver.py) is written to that file
at its place in the page instead of run. A block marked `norun` is shown, not run (cloning
the repository, stopping everything). Any other block in a language that runs (python, js,
…) without `file=` or `norun` is an error: every sample on a tested page is exercised.

The environment names the Railhook to use: RAILHOOK_API_URL and RAILHOOK_API_KEY (the
quickstart sets them itself, from the demo); with --fresh-project each page gets a project
of its own, made with RAILHOOK_ADMIN_TOKEN. Each page runs in its own process group, which
is ended afterwards with every receiver it started. Prints one line per page and a closing
line in cargo's format, so deploy/local/test.sh counts the pages with the Rust tests.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

RUNNABLE = {"python", "py", "js", "javascript", "mjs", "ts", "go", "ruby", "php", "java", "rust"}
SHELL = {"sh", "bash", "shell"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def blocks(text):
    """(line, language, words, code) of each fenced block."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        words = info.replace(",", " ").split()
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        code = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[start:j])
        yield start, (words[0] if words else ""), words[1:], code
        i = j + 1


def script_of(page):
    """The page as one bash script (files written by heredoc at their place), or an error."""
    parts = ["set -euo pipefail"]
    for line, lang, words, code in blocks(open(page).read()):
        if "norun" in words:
            continue
        target = next((w[len("file="):] for w in words if w.startswith("file=")), None)
        if target:
            marker = "RAILHOOK_DOC_SAMPLE_EOF"
            parts.append(f"# {page}:{line}: {target}\ncat > {target} <<'{marker}'\n{code}\n{marker}")
        elif lang in SHELL:
            parts.append(f"# {page}:{line}\n{code}")
        elif lang in RUNNABLE:
            raise SystemExit(f"{page}:{line}: a {lang} sample that nothing runs: give it file=NAME "
                             "and run it from an sh block, or mark it norun")
    return "\n".join(parts) + "\n"


def fresh_project(page):
    """A project of its own for a guide (RAILHOOK_ADMIN_TOKEN), so pages share nothing."""
    import json
    import urllib.request

    def call(path, body):
        req = urllib.request.Request(
            os.environ["RAILHOOK_API_URL"] + path, data=json.dumps(body).encode(), method="POST",
            headers={"authorization": "Bearer " + os.environ["RAILHOOK_ADMIN_TOKEN"],
                     "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as answer:
            return json.load(answer)

    name = os.path.splitext(os.path.basename(page))[0]
    org = call("/v1/organizations", {"name": f"docs {name}", "monthly_quota": 1000000})
    return call("/v1/projects", {"organization_id": org["id"], "name": f"docs {name}"})["api_key"]


def run(page, timeout, own_project):
    script = script_of(page)
    if own_project:
        os.environ["RAILHOOK_API_KEY"] = fresh_project(page)
    work = tempfile.mkdtemp(prefix="railhook-doc-")
    path = os.path.join(work, "page.sh")
    with open(path, "w") as f:
        f.write(script)
    started = time.monotonic()
    # The output goes to a file, not a pipe: a reader's background process (a receiver)
    # keeps its copy of the descriptor open after bash exits.
    log = os.path.join(work, "output.log")
    with open(log, "w") as out_file:
        proc = subprocess.Popen(["bash", path], cwd=os.environ.get("DOC_SAMPLE_CWD") or work,
                                stdin=subprocess.DEVNULL, stdout=out_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ok = proc.wait(timeout=timeout) == 0
            note = ""
        except subprocess.TimeoutExpired:
            ok, note = False, f"(timed out after {timeout} s)\n"
        finally:
            # The page's process group: every receiver it started in the background.
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    with open(log) as f:
        out = f.read() + note
    return ok, out, time.monotonic() - started, work


def guides_of(summary):
    """The pages of the "# Guides" part of SUMMARY.md, in order: every guide is tested."""
    pages, part = [], None
    base = os.path.dirname(summary)
    for line in open(summary):
        if line.startswith("# "):
            part = line[2:].strip()
        m = re.search(r"\]\(([^)#]+\.md)\)", line)
        if part == "Guides" and m:
            pages.append(os.path.join(base, m.group(1)))
    return pages


def main():
    parser = argparse.ArgumentParser(description="Runs documentation pages' samples.")
    parser.add_argument("--fresh-project", action="store_true",
                        help="give each page a project of its own (RAILHOOK_ADMIN_TOKEN)")
    parser.add_argument("--guides-from", metavar="SUMMARY.md",
                        help='also run every page of its "# Guides" part')
    parser.add_argument("pages", nargs="*", metavar="PAGE.md")
    args = parser.parse_args()
    pages = args.pages + (guides_of(args.guides_from) if args.guides_from else [])
    timeout = int(os.environ.get("DOC_SAMPLE_TIMEOUT", "900"))
    passed = failed = 0
    for page in pages:
        ok, out, seconds, work = run(page, timeout, args.fresh_project)
        print(f"test docs::{page} ... {'ok' if ok else 'FAILED'} ({seconds:.1f} s, in {work})", flush=True)
        if ok:
            passed += 1
        else:
            failed += 1
            sys.stdout.write(out[-20000:])
    print(f"\ntest result: {'ok' if failed == 0 else 'FAILED'}. {passed} passed; {failed} failed; "
          "0 ignored; 0 measured; 0 filtered out")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
