"""Replica placement for checkpoint fragments (planned; nothing is implemented here yet).

DESIGN.md describes it: copies of fragments placed in peer host memory, other
nodes' disks or the remote store, chosen by a policy fed by failure forecasts
from :mod:`reliability`, with a reinforcement-learning policy measured against
honest baselines. No issue for it is open yet.
"""
