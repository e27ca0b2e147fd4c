"""The sweep file: its YAML and overrides (:mod:`.overrides`), its sections as pydantic models
(:mod:`.sections`), the search space (:mod:`.space`), the whole sweep and its cross-checks
(:mod:`.sweep`), the way pydantic's errors are said (:mod:`.messages`), and one trial as it crosses
into Tune (:mod:`.trial`). Nothing here touches a store or a service."""
