"""The method: the seam, the attention maths, the measures, and everything of one recorded pass (the Analysis and
its records reader, row blocks, spill, memory check, interventions, log-probabilities, export), the residual recorder,
the flows and the attribution methods. See cwviz/core/__init__.py."""
