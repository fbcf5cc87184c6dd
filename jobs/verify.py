"""`python -m jobs.verify OUTPUT_DIR`: check everything a job committed, and read it all back.

    python -m jobs.verify /data/synth            # exit 0: what is committed is sound; 1: problems, each
                                                 # named; 2: usage. Its last line says whether the run is complete
    python -m jobs.verify /data/a --against /data/b   # 0: every common key identical, none missing; 1: not

With `--against OTHER_DIR` it compares two outputs key by key instead (jobs/output/compare.py):
`latent_sha256` and the members' bytes; identical, differing and missing keys (on both sides), with
counts and the first few keys. An output made before samples carried `latent_sha256` is refused (2).

What it checks, shard by shard, the index, and every sample read back with webdataset, is
jobs/output/audit.py's (its docstring lists each check). Read-only: it moves and rewrites nothing
(a rerun of the job quarantines and regenerates).
"""

from __future__ import annotations

import argparse
import logging
import sys

from jobs.errors import UserError
from jobs.output.audit import PROBLEMS_SHOWN, verify_output
from jobs.output.compare import compare_outputs
from jobs.output.storage import local_folder_arg

log = logging.getLogger("jobs.verify")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.verify", description=__doc__.split("\n")[0])
    parser.add_argument("output_dir", help="the output_dir of a bcgen job")
    parser.add_argument("--against", metavar="OTHER_DIR", help="compare with another job's output_dir, key by key, "
                        "by latent_sha256 and member bytes, instead of checking OUTPUT_DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")
    try:
        args.output_dir = local_folder_arg(args.output_dir, "jobs.verify")
        if args.against is not None:
            return _against(args.output_dir, local_folder_arg(args.against, "jobs.verify"))
        report = verify_output(args.output_dir)
    except UserError as e:
        log.error("%s", e)
        return 2
    for note in report.notes:
        log.info("note: %s", note)
    for name in report.foreign[:PROBLEMS_SHOWN]:
        log.warning("not the run's: %s; left alone, never indexed (move it out of output_dir: a glob of it would "
                    "read it)", name)
    for problem in report.problems[:PROBLEMS_SHOWN]:
        log.error("problem: %s", problem)
    if len(report.problems) > PROBLEMS_SHOWN:
        log.error("... and %d more problems", len(report.problems) - PROBLEMS_SHOWN)
    verdict = f"{len(report.problems)} problem(s)" if report.problems else "OK"
    if report.foreign:
        verdict += f" ({len(report.foreign)} file(s) in it are not the run's, listed above)"
    log.info("%s: %s; %d shard(s), %d sample(s) read back; %s", args.output_dir, verdict, report.shards,
             report.samples, report.completeness())
    return 1 if report.problems else 0


def _against(here, there) -> int:
    cmp = compare_outputs(here, there)
    for line in cmp.lines():
        (log.info if line.startswith("identical") else log.error)("%s", line)
    log.info("%s", cmp.verdict())
    return 0 if cmp.same else 1


if __name__ == "__main__":
    sys.exit(main())
