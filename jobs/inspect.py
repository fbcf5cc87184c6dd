"""`python -m jobs.inspect OUTPUT_DIR [--out DIR] [--samples N]`: a look at what a job wrote.

    OUTPUT_DIR/_inspect/          (or --out DIR)
        contact_sheet.png         a grid of samples, key and prompt under each tile
        index.html                the same samples, full size, with key/prompt/signature/mode/seed
        images/STEM.jpg|png|webp  the samples' image members, extracted byte for byte
        images/STEM.mp4 (.wav)    a video sample's clip (and soundtrack), byte for byte; the page plays
                                  them and names frames, size and fps (sound: its length), read from
                                  the files themselves; the sheet shows the first frame (without
                                  PyAV: a warning naming it and the install command, once)
        throughput.png            images/s over time by signature, captures and releases marked
                                  (from OUTPUT_DIR/_timeline/, written while the job ran)
        pages/                    with --pages (or a filter): every sample, or those the filters keep,
                                  --page-size a page (index.html, page-0001.html, ...; jobs/look/pages.py),
                                  clips with their sound, captioned as index.html's
        .inspect-files            (here and in pages/) what the last look wrote: the next look into the
                                  folder removes those it does not write again, and nothing else

    python -m jobs.inspect OUT --pages                                  the whole run
    python -m jobs.inspect OUT --signature 128x128/t64 --text star      filtered (all filters must hold)
    python -m jobs.inspect OUT --flag nonfinite                         NaN/Inf images (or: truncated)

The look itself is jobs/look/report.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from jobs.errors import EXIT_USAGE, UserError
from jobs.look.media_info import PyAVCheck
from jobs.look.pages import Filter
from jobs.look.report import DEFAULT_OUT, inspect_output, inspect_pages
from jobs.output.storage import local_folder_arg

log = logging.getLogger("jobs.inspect")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.inspect", description=__doc__.split("\n\n")[0])
    ap.add_argument("output_dir", help="a bcgen job's output_dir")
    ap.add_argument("--out", type=Path, default=None, help=f"where to write (default OUTPUT_DIR/{DEFAULT_OUT})")
    ap.add_argument("--samples", type=int, default=36, help="samples on the sheet and the page (default 36)")
    ap.add_argument("--pages", action="store_true", help="also page through every sample (OUT/pages/)")
    ap.add_argument("--page-size", type=int, default=100, help="samples a page (default 100)")
    ap.add_argument("--signature", help="pages: samples whose signature contains this, e.g. 128x128/t64")
    ap.add_argument("--text", help="pages: samples whose prompt or key contains this (any case)")
    ap.add_argument("--mode", help="pages: replay, eager or mixed")
    ap.add_argument("--flag", help="pages: nonfinite (NaN/Inf images) or truncated (prompts cut)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")
    try:
        output_dir = local_folder_arg(args.output_dir, "jobs.inspect")
        flt = Filter(signature=args.signature, text=args.text, mode=args.mode, flag=args.flag)
        pyav = PyAVCheck()  # one for both looks: a missing PyAV is said once
        r = inspect_output(output_dir, args.out, args.samples, pyav)
        log.info("wrote %s, %s%s and %d samples under %s", r.sheet.name, r.page.name,
                 f", {r.plot.name}" if r.plot else "", len(r.samples), r.out)
        if args.pages or flt != Filter():
            folder, matched = inspect_pages(output_dir, args.out, flt, args.page_size, pyav)
            log.info("pages: %d samples (%s), %d a page: %s", matched, flt.describe(), args.page_size,
                     folder / "index.html")
    except UserError as e:
        log.error("%s", e)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
