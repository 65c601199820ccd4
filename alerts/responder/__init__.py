"""The responder: Alertmanager's webhook receiver (:mod:`.service`), its durable store
(:mod:`.store`, :mod:`.incidents`, :mod:`.audit`), the action runner (:mod:`.action_runner`)
and the guards around every action (:mod:`.guards`)."""
