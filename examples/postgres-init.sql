-- Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d):
-- the demo replicas (profile "demo") get a database of their own.
CREATE DATABASE context_proxy_demo OWNER context_proxy;
-- The replicas of profile "s3" (artifacts in MinIO, no shared volume) get one too.
CREATE DATABASE context_proxy_s3 OWNER context_proxy;
