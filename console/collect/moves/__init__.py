"""The incident moves' plans: failover targets ranked, the playbook."""
