"""The process runtime every server process shares: its clock (stalls subtracted, wall time floored), the
monitor task (loop lag, the stall guard, the systemd watchdog), signals, and SIGHUP's reload. Imports
nothing else of ``idled.server``.
"""
