"""duly on AWS: the functions' settings and database logins, the wake-up schedule, the wake
slots and the kicks."""
