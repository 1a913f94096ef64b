"""`grail compare`: arms × seeds, planned (`plan`), scheduled (`schedule`), each run trained and evaluated (`run`),
then a report over seeds (`report`, `markdown`, `stats`, `plots`, `sweep`, `auroc`) and the command line (`cli`)."""
