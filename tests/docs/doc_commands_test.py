#!/usr/bin/env python3
# Every `paratrain` command in README.md's and docs/**/*.md's ```sh blocks
# must at least parse, so the docs cannot drift from the CLI (issue 23,
# section 4). Each one runs as written from the source folder with
# PARATRAIN_PARSE_ONLY=1 (apps/paratrain/commands.h): `train` and
# `federated` load the config, apply --set and validate it; `launch` checks
# its options, and its worker command after `--`, when that is paratrain,
# is checked as a command of its own; the other commands are parsed by
# CLI11 only, so a path that an earlier command would have made (a
# checkpoint, a run folder) need not exist.
#
# Skipped, and listed in the output: commands with placeholders the reader
# fills in (HOST, R, PROGRAM ARGS..., `-- ...`), shell expansions ($i),
# and paratrain inside `sh -c '...'`.
#
# usage: doc_commands_test.py BUILD/paratrain SOURCE_DIR
import concurrent.futures
import glob
import os
import re
import shlex
import subprocess
import sys

binary, source = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
PLACEHOLDER = re.compile(r"^([A-Z][A-Z_]*(\.\.\.)?|\.\.\.|[A-Z]+:\d+)$")
SEPARATORS = {";", "&&", "||", "|", "&"}


def sh_commands(path):
    """(line number, text) of each command line in the file's ```sh blocks, continuations joined."""
    in_fence, is_sh, joined, start = False, False, "", 0
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence:
            in_fence, is_sh = not in_fence, not in_fence and fence.group(1) == "sh"
            continue
        if not is_sh:
            continue
        line = line.rstrip("\n")
        if not joined:
            start = number
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        yield start, (joined + line).strip()
        joined = ""


def simple_commands(text):
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words, skip_next = [], False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in SEPARATORS:
            yield words
            words = []
        elif token in {">", ">>", "<", "2>"}:
            skip_next = True  # a redirection and its file
        else:
            words.append(token)
    yield words


def is_paratrain(word):
    return os.path.basename(word) == "paratrain"


failures, skipped = [], []
# (args, environment) -> where the docs give it; each distinct command runs
# once (a process start costs ~0.4 s of CPU: LibTorch's libraries load).
commands = {}


def check(where, args, env_extra):
    commands.setdefault((tuple(args), tuple(sorted(env_extra.items()))), []).append(where)


def run(command):
    args, env_extra = command
    env = dict(os.environ, PARATRAIN_PARSE_ONLY="1", **dict(env_extra))
    try:
        r = subprocess.run([binary] + list(args), cwd=source, env=env, capture_output=True, text=True, timeout=60)
        return r.returncode == 0, f"exit {r.returncode}: {(r.stdout + r.stderr).strip()}"
    except subprocess.TimeoutExpired:
        return False, "still running after 60 s under PARATRAIN_PARSE_ONLY=1"


files = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "**", "*.md"),
                                                               recursive=True))
for path in files:
    for number, text in sh_commands(path):
        where = f"{os.path.relpath(path, source)}:{number}"
        for words in simple_commands(text):
            # The program word: its basename is paratrain and it is no option's value (--prefix .../paratrain).
            at = next((i for i, w in enumerate(words)
                       if is_paratrain(w) and (i == 0 or not words[i - 1].startswith("-"))), None)
            if at is None:
                continue
            env_extra = dict(w.split("=", 1) for w in words[:at] if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w))
            args = words[at + 1:]
            # `launch FLAGS -- WORKER...`: parse-only checks the flags, not the
            # worker; a worker that is paratrain is checked on its own below.
            head, worker = args, []
            if args[:1] == ["launch"] and "--" in args:
                head, worker = args[:args.index("--") + 1], args[args.index("--") + 1:]
            if any("$" in w for w in words[:at] + head):
                skipped.append(f"{where}: shell expansion: {text}")
            elif any(PLACEHOLDER.match(w) for w in head[1:]):
                skipped.append(f"{where}: placeholders: {text}")
            else:
                check(where, args, env_extra)
            # What `paratrain launch` passes its workers through the environment.
            for flag, variable in (("--num-servers", "PARATRAIN_PS_SERVERS"), ("--backend", "PARATRAIN_BACKEND")):
                if flag in head[:-1]:
                    env_extra = dict(env_extra, **{variable: head[head.index(flag) + 1]})
            if worker and is_paratrain(worker[0]):
                if any("$" in w or PLACEHOLDER.match(w) for w in worker):
                    skipped.append(f"{where} (worker): shell expansion or placeholders: {text}")
                else:
                    check(where + " (worker)", worker[1:], env_extra)
            elif worker and any("paratrain" in w for w in worker):
                skipped.append(f"{where} (worker): paratrain inside another program's arguments: {text}")

with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    for command, (ok, output) in zip(commands, pool.map(run, commands)):
        if not ok:
            args, env_extra = command
            env_text = "".join(f"{k}={v} " for k, v in env_extra)
            failures.append(f"{', '.join(commands[command])}: {env_text}paratrain {shlex.join(args)}\n    {output}")

for s in skipped:
    print(f"skipped {s}")
print(f"{len(commands)} distinct commands checked, {len(skipped)} skipped, {len(failures)} failed")
for f in failures:
    print(f"FAILED {f}")
# An extractor that finds nothing must not pass.
if len(commands) < 30:
    print(f"FAILED: only {len(commands)} commands found; is the extraction broken?")
    sys.exit(1)
sys.exit(1 if failures else 0)
