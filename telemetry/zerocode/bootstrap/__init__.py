"""The folder ``stormwatch run`` puts first on the job's ``PYTHONPATH``: its
``sitecustomize`` module starts telemetry in each rank (see :mod:`.sitecustomize`).

It is a package only so that it ships in the wheel; Python imports ``sitecustomize``
from it as a top-level module.
"""
