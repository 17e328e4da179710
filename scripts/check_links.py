#!/usr/bin/env python3
"""Checks that every relative link and #anchor in the docs resolves; mdBook does not fail on a broken one.

Checked by default: docs/src/**/*.md (the book), README.md, bench/*/README.md and samples/README.md.
For each Markdown link, reference definition and HTML href/src that is not a URL (http:, mailto:, ...):

- the path must exist inside the repository (a file or a folder), relative to the linking file;
- an #anchor into a Markdown file must be one of its headings, slugged as GitHub slugs them (lower case,
  punctuation dropped, spaces to hyphens, -1, -2 ... for repeats), or an explicit <a id="...">;
- for a page of the book, with --book DIR (the HTML mdBook built), the anchor must also be an id in the
  built page, so it works on GitHub and in the rendered book alike;
- from the book, a link to a .md file outside docs/src is refused (mdBook rewrites .md links to .html,
  which exist only for the book's own pages: link to the folder instead, GitHub shows its README), and a
  page of the book must be listed in docs/src/SUMMARY.md (mdBook renders no other).

Links inside code spans and fenced code blocks are not links and are skipped.
Prints `FILE:LINE: broken link TARGET: why` for each problem and exits 1 if there is any.

Usage: check_links.py [--root DIR] [--book DIR] [FILE...]
       check_links.py --self-test     (proves the checker finds broken links and anchors)
"""

import argparse
import glob
import html
import os
import re
import sys
import tempfile
import unicodedata
import urllib.parse

BOOK_SRC = os.path.join("docs", "src")
DEFAULT_FILES = ["docs/src/**/*.md", "README.md", "bench/*/README.md", "samples/README.md"]

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title"): the text may hold one level of brackets, the target may be in <...>.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
HTML_ID = re.compile(r"""<a\b[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HEADING_ATTR = re.compile(r"\s*\{#([^}\s]+)[^}]*\}\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def prose_lines(text, blank_code=True):
    """(line number, line) for each line outside fenced code blocks, code spans blanked unless told."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            continue
        yield number, CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line) if blank_code else line


def links(text):
    """(line number, target) for every link in the Markdown text."""
    for number, line in prose_lines(text):
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1).strip("<>")
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1).strip("<>")
        for m in HTML_ATTR.finditer(line):
            yield number, html.unescape(m.group(1))


def heading_text(raw):
    """A heading's text as rendered: code spans keep their content, link and emphasis markup goes."""
    raw = HEADING_ATTR.sub("", raw)
    raw = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", raw)
    raw = re.sub(r"<[^>]+>", "", raw)
    raw = re.sub(r"(`+)(.+?)\1", lambda m: m.group(2).strip(), raw)
    return html.unescape(raw)


def github_slug(text):
    """GitHub's heading anchor: lower case, punctuation and symbols dropped, each space a hyphen."""
    out = []
    for ch in text.lower():
        if ch.isalnum() or ch in "-_" or unicodedata.category(ch).startswith("M"):
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def markdown_anchors(text):
    """Anchors a Markdown file offers: its headings' slugs (repeats numbered) and explicit ids."""
    anchors, seen = set(), {}
    for _, line in prose_lines(text, blank_code=False):
        m = HEADING.match(line)
        if m:
            attr = HEADING_ATTR.search(m.group(2))
            if attr:
                anchors.add(attr.group(1))  # mdBook's {#id}; GitHub shows it as text
            slug = github_slug(heading_text(m.group(2)))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
        for m in HTML_ID.finditer(line):
            anchors.add(m.group(1))
    return anchors


def html_ids(path):
    with open(path, encoding="utf-8") as f:
        return {html.unescape(i) for i in re.findall(r"""\bid\s*=\s*["']([^"']+)["']""", f.read())}


def summary_pages(root):
    summary = os.path.join(root, BOOK_SRC, "SUMMARY.md")
    if not os.path.exists(summary):
        return set()
    with open(summary, encoding="utf-8") as f:
        text = f.read()
    pages = {os.path.join(root, BOOK_SRC, "SUMMARY.md")}
    for _, target in links(text):
        if not SCHEME.match(target):
            pages.add(os.path.normpath(os.path.join(root, BOOK_SRC, urllib.parse.unquote(target.split("#")[0]))))
    return pages


class Checker:
    def __init__(self, root, book=None):
        self.root = os.path.abspath(root)
        self.book = os.path.abspath(book) if book else None
        self.src = os.path.join(self.root, BOOK_SRC)
        self.pages = summary_pages(self.root)
        self.anchor_cache = {}
        self.problems = []

    def in_book(self, path):
        return path == self.src or path.startswith(self.src + os.sep)

    def anchors(self, path):
        if path not in self.anchor_cache:
            with open(path, encoding="utf-8") as f:
                found = markdown_anchors(f.read())
            if self.book and self.in_book(path):
                page = os.path.join(self.book, os.path.splitext(os.path.relpath(path, self.src))[0] + ".html")
                built = html_ids(page) if os.path.exists(page) else set()
                # Valid on GitHub and in the rendered book alike.
                found &= built
            self.anchor_cache[path] = found
        return self.anchor_cache[path]

    def problem(self, file, line, target, why):
        self.problems.append(f"{os.path.relpath(file, self.root)}:{line}: broken link {target}: {why}")

    def check_file(self, file):
        file = os.path.abspath(file)
        with open(file, encoding="utf-8") as f:
            text = f.read()
        for line, target in links(text):
            if SCHEME.match(target):
                continue
            self.check_link(file, line, target)

    def check_link(self, file, line, target):
        path, _, anchor = target.partition("#")
        path = urllib.parse.unquote(path.split("?")[0])
        anchor = urllib.parse.unquote(anchor)
        if path.startswith("/"):
            return self.problem(file, line, target, "absolute path; link relative to the file")
        resolved = os.path.normpath(os.path.join(os.path.dirname(file), path)) if path else file
        if resolved != self.root and not resolved.startswith(self.root + os.sep):
            return self.problem(file, line, target, "leads outside the repository")
        rel = os.path.relpath(resolved, self.root)
        if not os.path.exists(resolved):
            return self.problem(file, line, target, f"no such file or folder {rel}")
        if self.in_book(file) and path.endswith(".md"):
            if not self.in_book(resolved):
                return self.problem(file, line, target, f"mdBook turns .md links into .html, which {rel} will not have; link to its folder instead")
            if self.pages and resolved not in self.pages:
                return self.problem(file, line, target, f"{rel} is not in docs/src/SUMMARY.md, so mdBook does not render it")
        if os.path.isdir(resolved):
            if not anchor:
                return
            resolved = os.path.join(resolved, "README.md")
            if not os.path.exists(resolved):
                return self.problem(file, line, target, f"#{anchor} into a folder without a README.md")
        if anchor and resolved.endswith(".md") and anchor not in self.anchors(resolved):
            where = "in the built book or " if self.book and self.in_book(resolved) else ""
            self.problem(file, line, target, f"no heading with anchor #{anchor} {where}in {os.path.relpath(resolved, self.root)}")


def default_files(root):
    files = []
    for pattern in DEFAULT_FILES:
        files += sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    return files


def self_test():
    """A broken path, a missing anchor, a .md link out of the book, an unlisted page: each is reported."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)

        write("README.md", "# Top\n\n## The `sm4c` command: run it\n\n"
              "[ok](docs/src/a.md#section-one) [ok](#the-sm4c-command-run-it) [ok](bench/)\n"
              "[gone](docs/src/missing.md)\n[bad anchor](docs/src/a.md#nowhere)\n"
              "`[code](not/checked.md)`\n\n```sh\n[fenced](not/checked.md)\n```\n[ok](https://example.org/x)\n")
        write("docs/src/SUMMARY.md", "# Summary\n\n- [A](a.md)\n")
        write("docs/src/a.md", "# A\n\n## Section one\n\n[ok](../../bench/) [out](../../bench/README.md) "
              "[unlisted](b.md) [ok](a.md#a)\n[up](../../../x)\n")
        write("docs/src/b.md", "# B\n")
        write("bench/x/README.md", "# Bench\n\n[ok](../../docs/src/a.md) [ref]\n\n[ref]: ../nope.md\n")
        checker = Checker(root)
        for f in default_files(root):
            checker.check_file(f)
        got = sorted(p.split(": broken link ")[0] + " " + p.split(": broken link ")[1].split(":")[0] for p in checker.problems)
        want = sorted([
            "README.md:6 docs/src/missing.md",
            "README.md:7 docs/src/a.md#nowhere",
            "docs/src/a.md:5 ../../bench/README.md",
            "docs/src/a.md:5 b.md",
            "docs/src/a.md:6 ../../../x",
            "bench/x/README.md:5 ../nope.md",
        ])
        if got != want:
            print("check_links.py self-test failed:\n  expected " + "\n           ".join(want) + "\n  got      " + "\n           ".join(got), file=sys.stderr)
            return 1
        print(f"check_links.py self-test: the {len(want)} planted broken links were all reported")
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), help="the repository (default: this script's)")
    ap.add_argument("--book", help="the HTML mdBook built (docs/book): anchors into the book must exist there too")
    ap.add_argument("--self-test", action="store_true", help="check that planted broken links are reported")
    ap.add_argument("files", nargs="*", help=f"Markdown files (default: {', '.join(DEFAULT_FILES)})")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if a.book and not os.path.isdir(a.book):
        ap.error(f"--book {a.book}: no such folder (build the book first: mdbook build docs)")
    checker = Checker(a.root, a.book)
    files = a.files or default_files(checker.root)
    for f in files:
        checker.check_file(f)
    for p in checker.problems:
        print(p, file=sys.stderr)
    if checker.problems:
        print(f"check_links.py: {len(checker.problems)} broken link(s) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"check_links.py: every relative link and anchor in {len(files)} files resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
