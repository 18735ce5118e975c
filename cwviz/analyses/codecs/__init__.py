"""One codec per record type: what a record of faithfulness, sinks, the atlas, the claims or the flow's causal test
holds, in one place (docs/METHOD.md, "Glossary": codec).

A record type's codec is the type itself: its ``name`` (``cwviz.<name>.record``), what decides its records' numbers
(``settings``: their fingerprint), ``encode`` (a payload from the tables one item gave), the checks a record read
back must pass (``payload``: keys and types; ``validate``: ranges and lengths; ``validate_run``: what the records of
one folder must share; ``manifest_fields``: its manifest's keys), and ``decode`` (the records back to the tables).
:mod:`cwviz.analyses.records` keeps the file format around them (envelope, writer, reader, locks, manifests) and
:mod:`cwviz.analyses.sweep` the runner; a check a record type needs goes into its codec, never into either.

* :mod:`~cwviz.analyses.codecs.base` — what every codec shares: the :class:`~cwviz.analyses.codecs.base.Codec`
  base, the field types several payloads use, the range and identity checks.
* :mod:`~cwviz.analyses.codecs.sweeps` — the sweeps' records: ``FAITHFULNESS`` (and the multiple-choice tasks),
  ``SINKS``, ``ATLAS``.
* :mod:`~cwviz.analyses.codecs.checks` — the pre-registered checks' records: ``CLAIMS``, ``FLOW_FAITHFULNESS``.

Nothing is imported here: every import names the module it needs.
"""
