"""Terminal tasks: inspect and transform files in a sandboxed shell, or fix a bug so hidden tests pass.

Every task states the exact output file and format, and is scored by checks run inside the sandbox
(``TerminalCheck``); bug-fix tasks carry their tests in ``hidden_files``, written only at scoring time.
"""

from __future__ import annotations

import random

from evalsuite.generators.base import COUNTRIES, WORDS, Builder, Draft, person
from evalsuite.schema import Difficulty, TerminalCheck

HIDDEN_DIR = ".evalsuite_hidden"
LEVELS = ("INFO", "DEBUG", "WARN", "ERROR")
SERVICES = ("auth", "billing", "search", "storage", "gateway")
_SIZES = {"easy": 12, "medium": 60, "hard": 200}


def _log_line(rng: random.Random, index: int) -> tuple[str, str, str, int]:
    level = rng.choices(LEVELS, weights=(5, 3, 2, 2))[0]
    service = rng.choice(SERVICES)
    status = rng.choice((200, 200, 201, 204, 400, 404, 500, 502, 503))
    return level, service, f"req-{rng.randrange(1000, 9999)}", status


def count_matches(rng: random.Random, difficulty: Difficulty) -> Draft:
    n = _SIZES[difficulty] + rng.randrange(5)
    lines = [_log_line(rng, i) for i in range(n)]
    service = rng.choice(SERVICES)
    # one line matching every tier's question, so no answer is a trivial 0
    lines[rng.randrange(n)] = ("ERROR", service, f"req-{rng.randrange(1000, 9999)}", 503)
    text = [
        f"2026-11-{1 + i % 28:02d}T10:{i % 60:02d}:00 {lvl} service={svc} request={req} status={st}"
        for i, (lvl, svc, req, st) in enumerate(lines)
    ]
    files: dict[str, str] = {}
    if difficulty == "easy":
        files["logs/app.log"] = "\n".join(text) + "\n"
        answer = sum(1 for lvl, *_ in lines if lvl == "ERROR")
        question = "How many lines of logs/app.log contain the level ERROR?"
        solution = "grep -c ' ERROR ' logs/app.log > answer.txt"
    elif difficulty == "medium":
        half = len(text) // 2
        files["logs/app-1.log"] = "\n".join(text[:half]) + "\n"
        files["logs/app-2.log"] = "\n".join(text[half:]) + "\n"
        answer = sum(1 for lvl, svc, *_ in lines if lvl in ("ERROR", "WARN") and svc == service)
        question = (
            f"How many lines, across all files in logs/, have level ERROR or WARN and service={service}?"
        )
        solution = f"cat logs/*.log | grep -E ' (ERROR|WARN) service={service} ' | wc -l > answer.txt"
    else:
        third = len(text) // 3
        files["logs/2026/app-a.log"] = "\n".join(text[:third]) + "\n"
        files["logs/2026/nested/app-b.log"] = "\n".join(text[third : 2 * third]) + "\n"
        files["logs/archive/app-c.log"] = "\n".join(text[2 * third :]) + "\n"
        answer = len({req for _, _, req, st in lines if st >= 500})
        question = (
            "How many DISTINCT request ids (request=...) have a status of 500 or above, across all .log files "
            "anywhere under logs/ (including subdirectories)?"
        )
        solution = (
            'find logs -name \'*.log\' -exec cat {} + | awk \'{split($5,s,"="); split($4,r,"="); '
            "if (s[2] >= 500) print r[2]}' | sort -u | wc -l > answer.txt"
        )
    prompt = f"{question} Write only the number to the file answer.txt in the current directory."
    check = TerminalCheck(name="answer", command="cat answer.txt", expected_stdout=str(answer))
    return Draft(
        task_type="count_matches", prompt=prompt, files=files, checks=[check], max_steps=8,
        expected={"reference_solution": solution},
    )  # fmt: skip


def sort_unique(rng: random.Random, difficulty: Difficulty) -> Draft:
    n = _SIZES[difficulty] // 2 + 4
    if difficulty == "easy":
        items = [rng.choice(WORDS) for _ in range(n)]
        files = {"words.txt": "\n".join(items) + "\n"}
        expected = sorted(set(items))
        prompt = "Write the distinct lines of words.txt, sorted alphabetically, to sorted.txt (one per line)."
        solution = "sort -u words.txt > sorted.txt"
    else:
        rows = [(rng.choice(WORDS), rng.randrange(1, 500)) for _ in range(n)]
        files = {"scores.tsv": "".join(f"{w}\t{s}\n" for w, s in rows)}
        if difficulty == "medium":
            expected = [f"{w}\t{s}" for w, s in sorted(set(rows), key=lambda r: (-r[1], r[0]))]
            prompt = (
                "scores.tsv has two tab-separated columns: name and score. Write its distinct lines to "
                "sorted.tsv sorted by score descending (numerically), ties broken by name ascending."
            )
            solution = "sort -u scores.tsv | sort -t$'\\t' -k2,2nr -k1,1 > sorted.tsv"
        else:
            best: dict[str, int] = {}
            for w, s in rows:
                best[w] = max(best.get(w, 0), s)
            expected = [f"{w}\t{s}" for w, s in sorted(best.items(), key=lambda r: (-r[1], r[0]))[:5]]
            prompt = (
                "scores.tsv has two tab-separated columns: name and score. For each name keep only its "
                "highest score, then write the top 5 names with that score (tab-separated, score "
                "descending, ties by name ascending) to sorted.tsv."
            )
            solution = (
                "sort -t$'\\t' -k1,1 -k2,2nr scores.tsv | awk -F'\\t' '!seen[$1]++' "
                "| sort -t$'\\t' -k2,2nr -k1,1 | head -5 > sorted.tsv"
            )
    out = "sorted.txt" if difficulty == "easy" else "sorted.tsv"
    check = TerminalCheck(name="sorted", command=f"cat {out}", expected_stdout="\n".join(expected))
    return Draft(
        task_type="sort_unique", prompt=prompt, files=files, checks=[check], max_steps=8,
        expected={"reference_solution": solution},
    )  # fmt: skip


def extract_column(rng: random.Random, difficulty: Difficulty) -> Draft:
    n = _SIZES[difficulty] // 2 + 3
    rows = []
    for i in range(n):
        name = person(rng)
        email = f"{name.split()[0].lower()}.{i}@{rng.choice(WORDS)}.example"
        rows.append((str(1000 + i), name, email, rng.choice(COUNTRIES), rng.randrange(10, 900)))
    header = "id,name,email,country,amount"
    files = {"customers.csv": header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)}
    if difficulty == "easy":
        expected = [r[2] for r in rows]
        prompt = (
            "Extract the email column of customers.csv (without the header) to emails.txt, in file order."
        )
        out = "emails.txt"
        solution = "tail -n +2 customers.csv | cut -d, -f3 > emails.txt"
    elif difficulty == "medium":
        country = rng.choice([r[3] for r in rows])
        expected = [r[2] for r in rows if r[3] == country]
        prompt = (
            f"Write to emails.txt the email of every customer in customers.csv whose country is {country}, "
            "one per line, in file order (no header)."
        )
        out = "emails.txt"
        solution = f"awk -F, 'NR > 1 && $4 == \"{country}\" {{print $3}}' customers.csv > emails.txt"
    else:
        totals: dict[str, int] = {}
        for r in rows:
            totals[r[3]] = totals.get(r[3], 0) + int(r[4])
        expected = [f"{c},{t}" for c, t in sorted(totals.items())]
        prompt = (
            "Compute the total amount per country in customers.csv and write totals.csv with lines "
            "'COUNTRY,TOTAL' sorted by country code, without a header."
        )
        out = "totals.csv"
        solution = "awk -F, 'NR > 1 {t[$4] += $5} END {for (c in t) print c \",\" t[c]}' customers.csv | sort > totals.csv"
    check = TerminalCheck(name="extract", command=f"cat {out}", expected_stdout="\n".join(expected))
    return Draft(
        task_type="extract_column", prompt=prompt, files=files, checks=[check], max_steps=8,
        expected={"reference_solution": solution},
    )  # fmt: skip


def rename_files(rng: random.Random, difficulty: Difficulty) -> Draft:
    count = {"easy": 3, "medium": 6, "hard": 9}[difficulty]
    numbers = rng.sample(range(1, 400), count)
    stem = rng.choice(WORDS)
    files: dict[str, str] = {}
    if difficulty == "easy":
        for num in numbers:
            files[f"inbox/{stem}_{num}.txt"] = f"note {num}\n"
        expected = sorted(f"{stem}_{num}.md" for num in numbers)
        prompt = "Rename every .txt file in inbox/ to the same name with the extension .md (keep contents)."
        listing = "ls inbox | sort"
        solution = 'cd inbox && for f in *.txt; do mv "$f" "${f%.txt}.md"; done'
        sample_path = f"inbox/{stem}_{numbers[0]}.md"
    elif difficulty == "medium":
        for num in numbers:
            files[f"photos/IMG_{num:05d}.JPG"] = f"jpeg {num}\n"
        expected = sorted(f"{stem}-{num}.jpg" for num in numbers)
        prompt = (
            f"In photos/, rename each IMG_NNNNN.JPG to {stem}-N.jpg where N is the number without leading "
            f"zeros (e.g. IMG_00042.JPG -> {stem}-42.jpg). Keep the contents."
        )
        listing = "ls photos | sort"
        solution = f'cd photos && for f in IMG_*.JPG; do n=${{f#IMG_}}; n=${{n%.JPG}}; mv "$f" "{stem}-$((10#$n)).jpg"; done'
        sample_path = f"photos/{stem}-{numbers[0]}.jpg"
    else:
        extensions = ("CSV", "Txt", "LOG")
        for i, num in enumerate(numbers):
            files[f"drop/{stem.title()}_{num}.{extensions[i % 3]}"] = f"payload {num}\n"
        expected = sorted(
            f"{extensions[i % 3].lower()}/{stem}_{num}.{extensions[i % 3].lower()}"
            for i, num in enumerate(numbers)
        )
        prompt = (
            "Move every file in drop/ into sorted/<ext>/ where <ext> is its extension in lower case, and "
            "lower-case the whole file name (e.g. drop/Ab_1.CSV -> sorted/csv/ab_1.csv). Keep contents; "
            "drop/ must end up empty."
        )
        listing = "cd sorted && find . -type f | sed 's|^./||' | sort && test -z \"$(ls -A ../drop)\""
        first_ext = extensions[0].lower()
        solution = (
            'for f in drop/*; do b=$(basename "$f"); l=$(echo "$b" | tr A-Z a-z); e=${l##*.}; '
            'mkdir -p sorted/$e; mv "$f" sorted/$e/$l; done'
        )
        sample_path = f"sorted/{first_ext}/{stem}_{numbers[0]}.{first_ext}"
    first_content = next(iter(files.values())).strip()
    checks = [
        TerminalCheck(name="names", command=listing, expected_stdout="\n".join(expected), weight=2.0),
        TerminalCheck(name="content", command=f"cat {sample_path}", expected_stdout=first_content),
    ]
    return Draft(
        task_type="rename_files", prompt=prompt, files=files, checks=checks, max_steps=10,
        expected={"reference_solution": solution},
    )  # fmt: skip


# Each bug template: (buggy source, docstring, hidden test assertions using {name}).
_BUGS = [
    (
        "def {name}(values):\n    total = 0\n    for i in range(len(values) - 1):\n        total += values[i]\n"
        "    return total\n",
        "sums a list of numbers",
        [
            "assert {name}([{a}, {b}, {c}]) == {a} + {b} + {c}",
            "assert {name}([]) == 0",
            "assert {name}([{a}]) == {a}",
        ],
    ),
    (
        "def {name}(values):\n    best = values[0]\n    for v in values:\n        if v < best:\n            best = v\n"
        "    return best\n",
        "returns the largest element of a non-empty list",
        ["assert {name}([{a}, {b}, {c}]) == max({a}, {b}, {c})", "assert {name}([-{a}]) == -{a}"],
    ),
    (
        "def {name}(text):\n    return ' '.join(word.capitalize() for word in text.split(' ')[1:])\n",
        "capitalizes every word of a space-separated string",
        ["assert {name}('ab cd ef') == 'Ab Cd Ef'", "assert {name}('x') == 'X'"],
    ),
    (
        "def {name}(n):\n    if n <= 1:\n        return 1\n    return n * {name}(n - 2)\n",
        "returns n factorial (n!) for n >= 0",
        [
            "assert {name}(5) == 120",
            "assert {name}(0) == 1",
            "assert {name}({small}) == __import__('math').factorial({small})",
        ],
    ),
    (
        "def {name}(values, threshold):\n    return [v for v in values if v > threshold]\n",
        "returns the values greater than or equal to threshold, in order",
        [
            "assert {name}([{a}, {b}, {c}], {b}) == [v for v in [{a}, {b}, {c}] if v >= {b}]",
            "assert {name}([], 1) == []",
        ],
    ),
]
# The one-line fix of each _BUGS entry, in the same order: (buggy text, fixed text).
_FIXES = [
    ("range(len(values) - 1)", "range(len(values))"),
    ("if v < best", "if v > best"),
    ("text.split(' ')[1:]", "text.split(' ')"),
    ("(n - 2)", "(n - 1)"),
    ("v > threshold", "v >= threshold"),
]
_CORRECT = [
    "def {name}(values):\n    count = 0\n    for v in values:\n        if v % 2 == 0:\n            count += 1\n    return count\n",
    "def {name}(text):\n    return text[::-1]\n",
    "def {name}(a, b):\n    return a if a < b else b\n",
]
_CORRECT_DOCS = [
    "counts the even numbers in a list",
    "reverses a string",
    "returns the smaller of two numbers",
]


def fix_bug(rng: random.Random, difficulty: Difficulty) -> Draft:
    n_bugs = {"easy": 1, "medium": 1, "hard": 2}[difficulty]
    n_correct = {"easy": 0, "medium": 2, "hard": 3}[difficulty]
    module = rng.choice(("mathkit", "listtools", "textkit", "numutil"))
    params = {
        "a": rng.randrange(2, 60),
        "b": rng.randrange(2, 60),
        "c": rng.randrange(2, 60),
        "small": rng.randrange(2, 8),
    }
    sources: list[str] = []
    fixed: list[str] = []
    tests: list[str] = []
    described: list[str] = []
    bug_names = rng.sample([f"{w}_{s}" for w in WORDS for s in ("total", "calc", "pick", "fmt")], n_bugs)
    bug_indices = rng.sample(range(len(_BUGS)), n_bugs)
    for index, name in zip(bug_indices, bug_names, strict=True):
        template, doc, asserts = _BUGS[index]
        source = template.format(name=name).replace("\n", f'\n    """{doc.capitalize()}."""\n', 1)
        sources.append(source)
        fixed.append(source.replace(*_FIXES[index]))
        tests += [a.format(name=name, **params) for a in asserts]
        described.append(f"{name} ({doc})")
    for index in rng.sample(range(len(_CORRECT)), n_correct):
        name = f"{rng.choice(WORDS)}_{index}"
        doc = _CORRECT_DOCS[index].capitalize()
        source = _CORRECT[index].format(name=name).replace("\n", f'\n    """{doc}."""\n', 1)
        sources.append(source)
        fixed.append(source)
    order = list(range(len(sources)))
    rng.shuffle(order)
    module_text = "\n\n".join(sources[i] for i in order)
    fixed_text = "\n\n".join(fixed[i] for i in order)
    hidden = (
        f"import sys\nsys.path.insert(0, '.')\nfrom {module} import *\n\n"
        + "".join(f"{test}\n" for test in tests)
        + "print('OK')\n"
    )
    if difficulty == "easy":
        prompt = f"The function {described[0]} in {module}.py has a bug. Fix {module}.py so it behaves as documented."
    else:
        prompt = (
            f"{module}.py has {'a bug' if n_bugs == 1 else 'bugs'}: some functions do not do what their docstrings "
            f"say. Hidden tests will check every function against its docstring. Fix {module}.py; do not rename "
            "functions."
        )
    check = TerminalCheck(
        name="hidden_tests", command=f"python3 {HIDDEN_DIR}/test_{module}.py", expected_stdout="OK"
    )
    return Draft(
        task_type="fix_bug",
        prompt=prompt,
        files={f"{module}.py": module_text},
        hidden_files={f"{HIDDEN_DIR}/test_{module}.py": hidden},
        checks=[check],
        max_steps=12,
        expected={"reference_solution": f"cat > {module}.py <<'EOF_FIXED'\n{fixed_text}EOF_FIXED"},
    )


BUILDERS: dict[str, Builder] = {
    "count_matches": count_matches,
    "sort_unique": sort_unique,
    "extract_column": extract_column,
    "rename_files": rename_files,
    "fix_bug": fix_bug,
}
