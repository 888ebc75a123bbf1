#!/usr/bin/env python3
"""Every relative link in the given Markdown files resolves: the file (or folder) it names exists, and a
`#anchor` matches a heading of the Markdown file it points into, under GitHub's slug rules (lowercase, spaces to
'-', punctuation other than '-' and '_' removed, a repeated heading gets -1, -2, ...). Links to URLs with a scheme
(http:, https:, mailto:, ...) are not checked. Links inside fenced code blocks and inline code spans are not links.
Prints FILE:LINE: LINK for each broken one and exits 1 if there is any."""
import os
import re
import sys

FENCE = re.compile(r'^\s{0,3}(```|~~~)')
HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
# [text](target) or [text](target "title"); text may hold one level of brackets (a link around code, an image).
LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)')
CODE_SPAN = re.compile(r'(`+)(?:.+?)\1')
SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')


def prose_lines(path):
    """(line number, text) of each line outside fenced code blocks, inline code spans blanked."""
    fenced = None
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip('\n')
            m = FENCE.match(line)
            if m:
                if fenced is None:
                    fenced = m.group(1)
                elif line.strip().startswith(fenced):
                    fenced = None
                continue
            if fenced is None:
                yield number, line


def slug(heading):
    text = re.sub(r'!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)', r'\1', heading)  # a link's text only
    text = re.sub(r'<[^>]+>', '', text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


anchor_cache = {}


def anchors(path):
    if path not in anchor_cache:
        seen = {}
        found = set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f'{base}-{n}')
        # explicit HTML anchors: <a name="x"> / <a id="x">
        with open(path, encoding='utf-8') as f:
            found.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', f.read()))
        anchor_cache[path] = found
    return anchor_cache[path]


def main(files):
    broken = 0
    for path in files:
        for number, line in prose_lines(path):
            for m in LINK.finditer(CODE_SPAN.sub(lambda s: ' ' * len(s.group(0)), line)):
                target = m.group(1)
                if not target or SCHEME.match(target):
                    continue
                file_part, _, anchor = target.partition('#')
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                ok = os.path.exists(resolved)
                if ok and anchor:
                    ok = resolved.endswith('.md') and os.path.isfile(resolved) and anchor in anchors(resolved)
                if not ok:
                    print(f'{path}:{number}: {target}')
                    broken += 1
    if not broken:
        print(f'check-links: every relative link in {len(files)} files resolves')
    return 1 if broken else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
