#!/usr/bin/env python3
"""Pages each commit wrote, by table or index, read off a SQLite WAL.

    python3 tools/wal_pages.py DB_FILE WAL_FILE [LAST_COMMITS]

DB_FILE and WAL_FILE are copies taken while a server runs (copy the WAL
first, then the database). Each WAL frame is one page: a 24-byte header (the
page number, and on a commit's last frame the database size) then the page.
Page numbers are mapped to their table or index by SQLite's `dbstat` table,
through the sqlite3 command-line shell (on a copy, so the WAL copy stays as
read).
"""
import collections
import shutil
import struct
import subprocess
import sys
import tempfile


def commits(wal):
    data = open(wal, "rb").read()
    _, _, page_size, _, salt1, salt2, _, _ = struct.unpack(">IIIIIIII", data[:32])
    offset, current, out = 32, [], []
    while offset + 24 + page_size <= len(data):
        page, db_size, s1, s2 = struct.unpack(">IIII", data[offset:offset + 16])
        if (s1, s2) != (salt1, salt2):
            break
        current.append(page)
        if db_size:
            out.append(current)
            current = []
        offset += 24 + page_size
    return page_size, out


def names(db):
    with tempfile.TemporaryDirectory() as tmp:
        copy = f"{tmp}/copy.db"
        shutil.copy(db, copy)
        rows = subprocess.run(["sqlite3", copy, "SELECT pageno, name FROM dbstat"],
                              check=True, capture_output=True, text=True).stdout
    return {int(p): n for p, n in (line.split("|", 1) for line in rows.splitlines())}


def main():
    db, wal = sys.argv[1], sys.argv[2]
    last = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    page_size, found = commits(wal)
    by_page = names(db)
    print(f"page size {page_size}, {len(found)} commits in the WAL; the last {last}:")
    for pages in found[-last:]:
        counted = collections.Counter(by_page.get(p, f"page {p}") for p in pages)
        print(f"{len(pages):3} pages: " + ", ".join(f"{n}×{c}" if c > 1 else n
                                                   for n, c in counted.most_common()))


if __name__ == "__main__":
    main()
