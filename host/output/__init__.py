"""What flashlm shows and writes: the terminal (console.py); a run's statistics (stats.py), live
table (live.py), summary (summary.py), JSON and CSV (export.py) and figure (figure.py), with the
names and colours they share (labels.py); the tables and figures of plan, compare and the
roofline (plan_tables.py, plan_figures.py, roofline_tables.py, roofline_figure.py); and the
quality and evaluation tables of convert and eval (model_tables.py)."""
