"""decisionkit's version, in a module of its own so that any module can record it without importing the package."""

__version__ = "0.1.0"
# The name on the package index (`pip install decisionkit-course`); the import name stays `decisionkit`. The index's
# `decisionkit` is an unrelated project.
DISTRIBUTION = "decisionkit-course"
