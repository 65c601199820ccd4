"""One rank's telemetry: metrics (:mod:`.metrics`), the event log (:mod:`.events`: its records,
writer and parser; :mod:`.ranklogs`: a job's logs as chaos and alerts read them), spans
(:mod:`.tracing`), collective counting (:mod:`.comms`, :mod:`.collective_ops`), performance
arithmetic (:mod:`.perf`, :mod:`.instrument`), hang dumps (:mod:`.dump`), and the guard that
keeps a telemetry failure out of training (:mod:`.rank`)."""
