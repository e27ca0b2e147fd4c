"""``seqae report NAME``: the paper's figures and the search's story, from a sweep's MLflow runs
and its Optuna study, read through its record (:class:`sweeps.stores.workspace.SweepState`);
:func:`dashboards.report.page.build` writes it.

The report is one self-contained HTML file (figures embedded as PNG data) plus the PNGs beside
it, written to ``<workspace>/sweeps/<name>/report/`` and logged as artifacts of the sweep's
parent run under ``report/``. Each figure appears when the sweep has the data for it:

    fig2_epochs_by_latent.png      validation token accuracy over epochs, a line per latent length
    fig3_accuracy_by_fraction.png  best accuracy against latent length as % of input, a line per input length
    seeds_bands.png, seeds_boxes.png   mean +- standard error and box plots over seeds, per epoch
    summary.png                    above MANY trials: accuracy over epochs as percentile bands, and
                                   each trial's best accuracy against its cost as a hexbin
    losses.png                     train loss (per step where the trial logged its curve) and validation
                                   loss per trial (above MANY trials, of the DRAWN best)
    optuna_*.png                   optimization history, parameter importances, parallel
                                   coordinates (above MANY complete trials, of the MANY best), or
                                   the Pareto front of a multi-objective sweep
    front.png                      with two objectives: the front chosen on validation, drawn with
                                   its test scores, beside the published grid's front where
                                   benchmarks/tables/frontier.parquet has the sweep's input length;
                                   and the front's hypervolume against the resource-seconds spent
                                   (its numbers in front.json)

Then a table of every trial, failed and running ones included (sortable, searchable, a page of
100 rows at a time), and validation samples at each latent ratio with the reconstruction's wrong
tokens highlighted.

Its modules, one job each: ``data`` (the runs read into :class:`~dashboards.report.data.Trial`
records), ``groups`` (the trials grouped as the paper compares them), ``figures`` (the trials'
figures, MANY and DRAWN), ``optuna_plots`` (the study's), ``front`` (a two-objective sweep's
front), ``story`` (what the sweep found) and ``page`` (the page, and ``build``).
"""

import matplotlib

matplotlib.use("Agg")  # files only, no display: set here, before any module of the report imports pyplot
