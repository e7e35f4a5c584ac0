"""Closing the loop: what the model answered is kept, what it could not answer is reviewed by a person, and the
person's decisions train the next model.

- ``store``: the decision log's tables in a SQLite file or any database SQLAlchemy reaches (PostgreSQL tested),
  opened and checked at once (``open_store``): a schema version, a file of someone else's refused.
- ``log``: ``DecisionLog``, which keeps every answered request off the request's path (a writer thread writes them
  in batches) and queues for review every request routed to a human and a seeded random audit share of the others.
- ``reviews``: the queue read (pending first, least confident first), a person's answer recorded (append-only:
  who, when, accept / correct / not-a-case), the reviews as a DataFrame and the reviewers' agreement.
- ``retrain``: the reviewed cases as training rows beside an export (split by hash into train and a review test;
  the audit kept out of training, to measure), the new model set beside the one that served them, and ``promote``.
"""

AUDIT_SHARE = 0.02  # of the answered requests, queued for review at random (``decisionkit serve --audit-share``)
