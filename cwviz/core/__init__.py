"""The core: the only code that knows torch and transformers internals.

Flow: :mod:`.models` loads a model with cwviz's attention function (:mod:`.capture`, the seam), one
forward pass records each layer's queries, keys and values, :mod:`.measures` turns a layer's record
into attention and contribution weights, and :mod:`.analysis` holds the result (:class:`.Analysis`).
:mod:`.interventions` changes a forward pass (masked or scaled values); :mod:`.memory`, :mod:`.tokens`,
:mod:`.texts`, :mod:`.settings` and :mod:`.errors` serve them.
"""
