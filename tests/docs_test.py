#!/usr/bin/python3
"""The documentation's commands run, and its links resolve.

For README.md and every docs/*.md page:
  - each block marked by a line `<!-- runnable -->` just before its opening fence (```sh or
    ```python) runs, in the page's order, in a fresh scratch directory holding links `build`
    (the build directory), `data`, `examples` and `scripts` (the repository's): sh blocks under
    `bash -euo pipefail -c`, python blocks under Debian's /usr/bin/python3 (which the module is
    built for) with the build's package on PYTHONPATH, each within TIMEOUT seconds; a failing
    block ends its page;
  - a page without a runnable block fails (docs/config.md, generated, excepted);
  - a relative link to a file that does not exist, or to a heading a page does not have, fails.
Prints the blocks run and the seconds taken per page; exits 1 on any failure.

Usage: docs_test.py REPO_ROOT BUILD_DIR
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TIMEOUT = 120
PYTHON = "/usr/bin/python3"
MARKER = "<!-- runnable -->"
LINKED = ("build", "data", "examples", "scripts")
NO_BLOCKS_NEEDED = {"docs/config.md"}
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages(root):
    docs = sorted(f"docs/{name}" for name in os.listdir(os.path.join(root, "docs"))
                  if name.endswith(".md"))
    return ["README.md"] + docs


def runnable_blocks(lines, page):
    """(line number of the fence, language, code) of each marked block."""
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not fence or fence.group(2) not in ("sh", "python"):
            sys.exit(f"{page}:{i + 1}: {MARKER} must come just before a ```sh or ```python fence")
        indent, code = fence.group(1), []
        for body in lines[i + 2:]:
            if body.strip() == "```":
                break
            code.append(body[len(indent):] if body.startswith(indent) else body.lstrip())
        blocks.append((i + 2, fence.group(2), "\n".join(code) + "\n"))
    return blocks


def prose(lines):
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def anchors(lines):
    """GitHub's anchors of a page's headings."""
    seen, out = {}, set()
    for line in prose(lines):
        if line.startswith("#"):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def broken_links(root, page, lines):
    problems = []
    for line in prose(lines):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(root, os.path.dirname(page), path)) if path \
                else os.path.join(root, page)
            if not os.path.exists(file):
                problems.append(f"{page}: link to {target}: no file {os.path.relpath(file, root)}")
            elif anchor and file.endswith(".md") and anchor not in anchors(read_lines(file)):
                problems.append(f"{page}: link to {target}: no such heading")
    return problems


def run_page(root, build, page, blocks):
    """Runs the blocks in a scratch directory; the failure's report, or None."""
    scratch = tempfile.mkdtemp(prefix="seqforge-docs-")
    for name in LINKED:
        os.symlink(build if name == "build" else os.path.join(root, name),
                   os.path.join(scratch, name))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(build, "python"), env.get("PYTHONPATH")) if p)
    for line, language, code in blocks:
        command = (["bash", "-euo", "pipefail", "-c", code] if language == "sh"
                   else [PYTHON, "-c", code])
        with subprocess.Popen(command, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", start_new_session=True) as block:
            try:
                output = block.communicate(timeout=TIMEOUT)[0]
                status = f"exit code {block.returncode}"
            except subprocess.TimeoutExpired:
                os.killpg(block.pid, signal.SIGKILL)  # the block's shell and what it started
                output = block.communicate()[0]
                status = f"timed out after {TIMEOUT} s"
        if status != "exit code 0":
            return (f"{page}:{line}: a {language} block failed ({status}; scratch directory "
                    f"{scratch})\n--- command\n{code}--- output\n{output}")
    shutil.rmtree(scratch)
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    root, build = (os.path.abspath(p) for p in sys.argv[1:])
    failures, summary, total, start = [], [], 0, time.monotonic()
    for page in pages(root):
        lines = read_lines(os.path.join(root, page))
        failures += broken_links(root, page, lines)
        blocks = runnable_blocks(lines, page)
        if not blocks and page not in NO_BLOCKS_NEEDED:
            failures.append(f"{page}: no {MARKER} block")
        if not blocks:
            continue
        began, total = time.monotonic(), total + len(blocks)
        failure = run_page(root, build, page, blocks)
        if failure:
            failures.append(failure)
        summary.append(f"  {page}: blocks {len(blocks)}, {time.monotonic() - began:.1f} s"
                       f"{'  FAILED' if failure else ''}")
    print("\n".join(summary))
    print(f"{total} blocks on {len(summary)} pages in {time.monotonic() - start:.1f} s")
    for failure in failures:
        print(failure, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
