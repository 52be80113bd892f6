"""The processes of a multi-process run: the local launcher, its private network and its port book, Ray, Slurm,
the rendezvous before TensorFlow joins, and a peer lost mid-training told in one line.

Imports distribute/ (what a strategy's cluster looks like), never train/: whatever trains
is handed to the launcher as a callable.
"""
