"""Foundations every layer may use: settings, atomic saves, the compute dtype, the machine, figures."""
