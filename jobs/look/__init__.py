"""The look room: pictures of what a job wrote (`python -m jobs.inspect`).

May import: jobs/output/ (names), jobs/telemetry/ (the timeline it plots), sinks/; nothing that
generates. Files: report (samples chosen from the shards -> sheet, page, plot), contact_sheet,
gallery, throughput_plot, media_info, pages, names, written (what a look wrote into its folder).
"""
