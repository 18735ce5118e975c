"""The core: the only code that knows torch and transformers internals, in three wings by job.

* :mod:`cwviz.core.method` — the method, and everything of one recorded forward pass: the seam
  (:mod:`~cwviz.core.method.capture`, transformers' ``AttentionInterface``), the attention maths it and the readers
  call (:mod:`~cwviz.core.method.attention`), the measures (:mod:`~cwviz.core.method.measures`), the result
  (:mod:`~cwviz.core.method.analysis`, :class:`~cwviz.core.method.analysis.Analysis`, over the records reader of its
  pass, ``records_reader``), how a layer is read in row blocks (``row_blocks``, ``row_block_sizes``), kept on disk
  (``spill``) and sized (``memory``), changed (``interventions``), scored (``logprobs``) and exported (``export``); the
  residual recorder (``residual``) and the one per-context mechanism of the seam and the hooks (``hooks``); the flows
  and the attribution methods (``flow``, ``effect``, ``attribution``). Why together: they share one vocabulary (a
  layer's record, its row blocks, its measures) and change together when the method does (docs/METHOD.md).
* :mod:`cwviz.core.loading` — a model and what it accepts: the table of architectures and the rows derived for the
  others (``architectures``, ``derive``), the checkpoints converted once into the cache (``checkpoints``),
  :func:`~cwviz.core.loading.models.load_model` and the :class:`~cwviz.core.loading.models.Bundle`, what a prompt
  and a selection must be for that model (``inputs``), greedy continuation (``generate``) and a run's provenance
  (``provenance``: the model's weight hash, the versions a manifest records). Why apart: they know
  model families, files and tokenizers, and nothing of the measures.
* :mod:`cwviz.core.util` — services with no knowledge of models or of the method: the errors every room raises
  (``errors``), progress callbacks, display-ready tokens, prompt files and JSON Lines (``texts``), environment
  settings and the cache folder, file locks, the process's heap (what entry points opt in to: ``heap``), and
  accelerate's process state (``parallel``).

Beside the wings, two torch-free modules that every room of cwviz may import: :mod:`cwviz.core.vocabulary` (the words
every room shares: the contribution kinds and their labels) and :mod:`cwviz.core.defaults` (every default value,
once; it imports nothing).

``util`` is the bottom: it imports nothing of the core. ``loading`` and ``method`` meet at the seam, one way per
module: a model is loaded with cwviz's attention function, so ``loading.models`` and ``loading.derive`` import
``method.capture`` and ``method.measures`` (the per-model Gram matrix), which import nothing of ``loading``; the
method's result and its passes (``analysis``, ``row_blocks``, ``interventions``) take a loaded ``Bundle``. The import
graph of every module is a DAG (``tests/test_layout.py``; docs/ARCHITECTURE.md, "The order"). The sub-packages
import nothing in their ``__init__``: every import names the module it needs.
"""
