"""Topology files and what they drive.

:mod:`.schema` (the YAML shape), :mod:`.validation` (cross-checks naming file and key),
:mod:`.plan` (which node runs where, on which cluster, owned by whom), :mod:`.launch`
(``astraflow topology check``, ``astraflow launch``, ``astraflow node --topology``),
:mod:`.scaling` (the autoscaler's rule), :mod:`.backends` (how nodes are started and
retired) and :mod:`.accounting` (device-hours from heartbeats). The autoscaler actor
itself lives with the other actors, in ``astraflow.actors.autoscaler``.
"""
