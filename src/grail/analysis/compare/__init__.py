"""`grail compare`: arms × seeds, planned (`plan`), scheduled (`schedule`), each run trained and evaluated (`run`),
then a report over seeds (`summary`, `report`, `stats`, `plots`, `sweep`, `auroc`) and the command line (`cli`)."""
