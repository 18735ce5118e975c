# Makes the repository root importable for the tests (cwviz is used from the checkout, not installed).
