#!/usr/bin/env python3
"""Checks that migrations stay safe to apply under load (docs/operate/upgrades.md, "Writing a
migration"). Every migration newer than BASELINE must:

- build an index on an existing table without blocking writes: `CREATE INDEX CONCURRENTLY`
  in a file whose first line is `-- no-transaction` (sqlx then runs it outside a
  transaction), or `CREATE INDEX … ON ONLY` on a partitioned parent (then each partition
  CONCURRENTLY and `ALTER INDEX … ATTACH PARTITION`);
- add a NOT NULL column only with a DEFAULT (a constant default rewrites nothing);
- not rewrite a table (`ALTER COLUMN … TYPE`) or scan it under an exclusive lock
  (`SET NOT NULL`, a CHECK or FOREIGN KEY added without NOT VALID);
- contract only what an earlier release stopped using: DROP / RENAME of a column or table
  carries `-- contract: unused since <version>` naming an earlier release than this one.

Migrations up to BASELINE were reviewed by hand; why each is safe, or when it must run, is
in its own comments and in docs/OPERATIONS.md, Upgrades. `--self-test` checks the rules flag
known-bad statements. Called by deploy/validate.sh; exits 1 naming each violation."""
import glob
import os
import re
import sys

BASELINE = "20261204000011"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def current_version():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def statements(sql):
    """(statement, the comments on or just above it), split on semicolons at line ends."""
    out, buf, notes = [], [], []
    for line in sql.splitlines():
        code, _, comment = line.partition("--")
        if comment:
            notes.append(comment.strip())
        buf.append(code)
        if code.rstrip().endswith(";"):
            out.append((" ".join(" ".join(buf).split()), " ".join(notes)))
            buf, notes = [], []
    if " ".join(buf).strip():
        out.append((" ".join(" ".join(buf).split()), " ".join(notes)))
    return out


def check(name, sql, release):
    problems = []
    no_tx = sql.lstrip().lower().startswith("-- no-transaction")
    created = {m.lower() for m in re.findall(r"create table (?:if not exists )?(\w+)", sql, re.I)}
    for stmt, notes in statements(sql):
        s = stmt.lower()
        def bad(why):
            problems.append(f"{name}: {why}: {stmt[:100]}")
        m = re.match(r"create (?:unique )?index (concurrently )?(?:if not exists )?\S* ?on (only )?(\w+)", s)
        if m and m.group(3) not in created:
            if m.group(1):
                if not no_tx:
                    bad("CREATE INDEX CONCURRENTLY needs `-- no-transaction` as the file's first line")
            elif not m.group(2):
                bad("an index on an existing table must be built CONCURRENTLY (or ON ONLY a partitioned parent)")
        if re.search(r"add column .* not null", s) and " default " not in s:
            bad("a NOT NULL column needs a DEFAULT")
        if re.search(r"alter column \w+ (set data )?type ", s):
            bad("changing a column's type rewrites the table under an exclusive lock")
        if re.search(r"alter column \w+ set not null", s):
            bad("SET NOT NULL scans the table under an exclusive lock: add a CHECK … NOT VALID, VALIDATE it, then SET NOT NULL")
        if re.search(r"add (constraint \w+ )?(check|foreign key)", s) and "not valid" not in s:
            bad("add CHECK / FOREIGN KEY constraints NOT VALID, then VALIDATE CONSTRAINT in a later statement")
        if re.search(r"\bdrop (column|table)\b|\brename (column|to)\b", s):
            c = re.search(r"contract: unused since (\S+)", notes)
            if not c:
                bad("dropping or renaming needs `-- contract: unused since <release>` (expand/contract)")
            elif c.group(1) == release:
                bad(f"contract in the release that stopped using it ({release}): drop it one release later")
    return problems


def self_test():
    bad_samples = [
        "CREATE INDEX deliveries_x_idx ON deliveries (endpoint_id);",
        "CREATE INDEX CONCURRENTLY events_x_idx ON events (event_type);",
        "ALTER TABLE endpoints ADD COLUMN tier text NOT NULL;",
        "ALTER TABLE endpoints ALTER COLUMN url TYPE varchar(200);",
        "ALTER TABLE endpoints ALTER COLUMN description SET NOT NULL;",
        "ALTER TABLE endpoints ADD CONSTRAINT c CHECK (timeout_ms > 0);",
        "ALTER TABLE endpoints DROP COLUMN description;",
        "-- contract: unused since 0.1.0\nALTER TABLE endpoints DROP COLUMN description;",
    ]
    good_samples = [
        "-- no-transaction\nCREATE INDEX CONCURRENTLY endpoints_x_idx ON endpoints (url);",
        "CREATE INDEX deliveries_x_idx ON ONLY deliveries (endpoint_id);",
        "CREATE TABLE t (id int);\nCREATE INDEX t_idx ON t (id);",
        "ALTER TABLE endpoints ADD COLUMN tier text NOT NULL DEFAULT 'free';",
        "ALTER TABLE endpoints ADD CONSTRAINT c CHECK (timeout_ms > 0) NOT VALID;",
        "-- contract: unused since 0.0.9\nALTER TABLE endpoints DROP COLUMN description;",
    ]
    failures = [s for s in bad_samples if not check("sample", s, "0.1.0")]
    failures += [s for s in good_samples if check("sample", s, "0.1.0")]
    if failures:
        print("check_migrations self-test: misjudged\n" + "\n".join(failures))
        sys.exit(1)


if "--self-test" in sys.argv:
    self_test()
    print("check_migrations self-test passed")
    sys.exit(0)
problems = []
release = current_version()
for path in sorted(glob.glob(os.path.join(ROOT, "migrations", "*.sql"))):
    name = os.path.basename(path)
    if name.split("_")[0] <= BASELINE:
        continue
    problems += check(name, open(path).read(), release)
if problems:
    print("\n".join(problems))
    sys.exit(1)
print("migrations after the baseline are safe to apply under load")
