#!/usr/bin/env python3
"""The QMP schema an emulator introspects, with masked type names canonical.

    scripts/qmp-schema-canon.py QEMU OUT

Runs QEMU (`-M none`, QMP on stdio), asks query-qmp-schema and writes the
schema to OUT as JSON, one entity per line, sorted, after renaming every
masked type name (QAPI's introspection replaces type names by numbers
assigned in the order its generator first meets the types, so a schema that
merely defines more types under a false `if` numbers the others
differently: docs/building.md, "Off is stock"). Canonical names are
assigned by a walk from the commands and events in name order, each
entity's references in the order it lists them. Two emulators whose outputs
are equal introspect the same schema.
"""

import json
import subprocess
import sys


def query_schema(qemu):
    cmds = [
        {"execute": "qmp_capabilities"},
        {"execute": "query-qmp-schema", "id": "schema"},
        {"execute": "quit"},
    ]
    p = subprocess.run(
        [qemu, "-M", "none", "-display", "none", "-nodefaults", "-qmp", "stdio"],
        input="".join(json.dumps(c) + "\n" for c in cmds),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    for line in p.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("id") == "schema":
            if "return" not in msg:
                sys.exit(f"{qemu}: query-qmp-schema failed: {msg}")
            return msg["return"]
    sys.exit(f"{qemu}: no reply to query-qmp-schema (exit {p.returncode}): {p.stderr[-2000:]}")


def refs(entity):
    """The type names an entity refers to, in the order it lists them."""
    meta = entity["meta-type"]
    if meta in ("command", "event"):
        return [entity[k] for k in ("arg-type", "ret-type") if k in entity]
    if meta == "array":
        return [entity["element-type"]]
    if meta == "object":
        out = [m["type"] for m in entity.get("members", [])]
        out += [v["type"] for v in entity.get("variants", [])]
        return out
    if meta == "alternate":
        return [m["type"] for m in entity["members"]]
    return []


def canonical(schema):
    by_name = {e["name"]: e for e in schema}
    if len(by_name) != len(schema):
        sys.exit("two entities of one name")
    rename = {}
    done = set()

    def visit(name):
        if name in done:
            return
        if name not in by_name:
            sys.exit(f"reference to an undefined type {name!r}")
        done.add(name)
        if name.isdigit():
            rename[name] = f"t{len(rename)}"
        for r in refs(by_name[name]):
            visit(r)

    sys.setrecursionlimit(100000)
    for n in sorted(n for n, e in by_name.items() if e["meta-type"] in ("command", "event")):
        visit(n)

    def rn(v):
        if v.isdigit():
            return rename.get(v, "?")
        if v.startswith("[") and v.endswith("]"):
            return "[" + rn(v[1:-1]) + "]"
        return v

    def renamed(e):
        e = json.loads(json.dumps(e))
        e["name"] = rn(e["name"])
        for k in ("arg-type", "ret-type", "element-type"):
            if k in e:
                e[k] = rn(e[k])
        for k in ("members", "variants"):
            for m in e.get(k, []):
                if "type" in m:
                    m["type"] = rn(m["type"])
        return json.dumps(e, sort_keys=True)

    # Types no command or event reaches (their only references were under
    # a false `if`): named by their content, then what they reach.
    unreached = [n for n in by_name if n not in done]
    for n in sorted(unreached, key=lambda n: renamed(by_name[n])):
        visit(n)

    return sorted(renamed(e) for e in schema)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lines = canonical(query_schema(sys.argv[1]))
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
