"""Serving a saved model over HTTP: the LitServe app, its wire protocol, the Ray Serve deployment."""
