"""The dashboard's Streamlit code (the only Streamlit code besides ``app.py`` and ``views/``):
:mod:`.services` (caching), :mod:`.state` (session and URL state), :mod:`.sidebar`, :mod:`.widgets`,
:mod:`.hosting` (the shared-server policy) and :mod:`.launch` (``cwviz app``)."""
