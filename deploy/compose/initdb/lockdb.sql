-- Run once by the postgres image on an empty data volume: lockdb beside paydb (POSTGRES_DB).
CREATE DATABASE lockdb OWNER dlock;
