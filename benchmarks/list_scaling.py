"""The cost of a ListTrainingJobs page in the job database, by the number of jobs stored.

Every list call of ``server_throughput.py`` (every filter and sort, common and rare
matches, a page from the middle through its NextToken) is read with ``JobDB.list_summaries``
through one held connection, as the server's threads read it, from stores of each size
filled alike. Each call is timed in rounds over the sizes in turn and back; each size keeps
its best round (other work on the machine only slows a round down). The last column is the
time at the largest size over the time at the first: the goal is at most 1.5.

This is the database's share of a list request; ``server_throughput.py --jobs`` measures
the whole request through the server.

    python benchmarks/list_scaling.py [--jobs 1000,100000] [--rounds 8] [--seconds 0.2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_throughput import fill, list_calls

from trainport.jobs.db import JobDB, ListQuery
from trainport.server.connections import ThreadConnectionDB

PAGE = 100


def query_of(params: dict[str, object]) -> ListQuery:
    """The database query of a ListTrainingJobs request's filters and sort."""

    def number(field: str) -> float | None:
        value = params.get(field)
        return float(value) if isinstance(value, int | float) else None

    def text(field: str) -> str | None:
        value = params.get(field)
        return value if isinstance(value, str) else None

    return ListQuery(
        name_contains=text("NameContains"),
        status_equals=text("StatusEquals"),
        creation_after=number("CreationTimeAfter"),
        creation_before=number("CreationTimeBefore"),
        modified_after=number("LastModifiedTimeAfter"),
        modified_before=number("LastModifiedTimeBefore"),
        sort_by=text("SortBy") or "CreationTime",
        sort_order=text("SortOrder") or "Descending",
        limit=PAGE + 1,  # as the API asks: one more tells whether there is a next page
    )


def queries(db: JobDB, jobs: int) -> dict[str, ListQuery]:
    out = {label: query_of(params) for label, params in list_calls(jobs).items()}
    # The page halfway through the default order, as its NextToken asks for it.
    first = ListQuery(limit=jobs // 2)
    middle = db.list_summaries(first)[-1]
    out["List a middle page (NextToken)"] = ListQuery(limit=PAGE + 1, after=first.key_of(middle))
    return out


def best_ms(db: JobDB, query: ListQuery, seconds: float) -> float:
    """The fastest of the reads of ``query`` made in ``seconds``, in milliseconds."""
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        db.list_summaries(query)
        end = time.perf_counter()
        best = min(best, end - start)
        if end > deadline:
            return best * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1000,100000")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.2, help="per size, per round")
    args = parser.parse_args()
    sizes = [int(n) for n in args.jobs.split(",")]
    with tempfile.TemporaryDirectory(prefix="trainport-bench-") as tmp:
        dbs: dict[int, ThreadConnectionDB] = {}
        for jobs in sizes:
            db = ThreadConnectionDB(Path(tmp) / str(jobs) / "trainport.db")
            fill(db, "us-east-1", jobs)
            db.hold()  # one connection, as each of the server's threads keeps one
            dbs[jobs] = db
        plans = {jobs: queries(db, jobs) for jobs, db in dbs.items()}
        first, last = sizes[0], sizes[-1]
        print(
            f"jobs: {', '.join(map(str, sizes))}; {PAGE} per page; best of {args.rounds} "
            f"rounds of {args.seconds:g} s; {os.cpu_count()} CPUs"
        )
        header = " ".join(f"{f'{n} ms':>10}" for n in sizes)
        print(f"{'list call':42} {header} {f'{last}/{first}':>12}")
        worst = 0.0
        for label in plans[first]:
            best = {n: float("inf") for n in sizes}
            for turn in range(args.rounds):
                for jobs in sizes if turn % 2 == 0 else reversed(sizes):
                    took = best_ms(dbs[jobs], plans[jobs][label], args.seconds)
                    best[jobs] = min(best[jobs], took)
            ratio = best[last] / best[first]
            worst = max(worst, ratio)
            cells = " ".join(f"{best[n]:10.2f}" for n in sizes)
            print(f"{label:42} {cells} {ratio:11.2f}x", flush=True)
        print(f"slowest call at {last} jobs against {first}: {worst:.2f}x (goal: 1.5x at most)")
        for db in dbs.values():
            db.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
