"""What a sweep found, read from its stores: its trials as typed records (:mod:`.trials`), its
status (:mod:`.status`, and a submitted sweep's through the cluster: :mod:`.remote_status`), every
trial as a table (:mod:`.export`) and its registered model (:mod:`.registry`)."""
