"""Running a sweep: the driver (:mod:`.driver`) and the verbs that create, fork, extend and steer
sweeps (:mod:`.lifecycle`); Ray (:mod:`.ray_connection`, :mod:`.submit`) and Tune's side on the
driver (:mod:`.runner`, :mod:`.stoppers`, :mod:`.schedulers`, :mod:`.callbacks`); one trial in its
worker (:mod:`.trial`, :mod:`.system_metrics`); the data it trains on (:mod:`.sweep_data`); what a
person sees and is told (:mod:`.progress`, :mod:`.notify`) and which code ran (:mod:`.provenance`)."""
