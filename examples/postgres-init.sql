-- Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d):
-- the demo replicas (profile "demo") get a database of their own.
CREATE DATABASE context_proxy_demo OWNER context_proxy;
