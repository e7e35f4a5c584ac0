"""The System One contract: typed questions in, typed answers out, checked with pydantic."""
