#!/usr/bin/env python3
"""A stand-in for the `jq` command on machines without it, enough for the conformance runner in
../shared (`jq -e PROGRAM` over standard input), on the jq library's own Python bindings (PyPI `jq`).

Prints every output as JSON; with -e, exits 1 when the last output is false or null and 4 when
there is none, as jq does; exits 3 on a program that does not compile and 5 on a runtime error."""
import json
import sys

import jq


def main(argv):
    exit_status = False
    args = []
    for a in argv[1:]:
        if a in ("-e", "--exit-status"):
            exit_status = True
        elif a.startswith("-"):
            print(f"jq shim: option {a} is not supported", file=sys.stderr)
            return 2
        else:
            args.append(a)
    if len(args) != 1:
        print("jq shim: usage: jq [-e] PROGRAM < input", file=sys.stderr)
        return 2
    try:
        program = jq.compile(args[0])
    except ValueError as e:
        print(f"jq: error: {e}", file=sys.stderr)
        return 3
    try:
        outputs = program.input_text(sys.stdin.read()).all()
    except ValueError as e:
        print(f"jq: error: {e}", file=sys.stderr)
        return 5
    for o in outputs:
        print(json.dumps(o, indent=2))
    if exit_status:
        if not outputs:
            return 4
        if outputs[-1] is None or outputs[-1] is False:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
