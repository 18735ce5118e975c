"""Analyses built on the core measures: tidy tables (:mod:`.tables`), attention sinks (:mod:`.sinks`),
faithfulness by causal intervention (:mod:`.faithfulness`) and the bertviz views (:mod:`.bertviz`).

Nothing is imported here, so that :mod:`.schema` (the table types charts use) stays torch-free.
"""
