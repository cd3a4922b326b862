-- Rolls back 0001_init.sql.
DROP TABLE tidegate_meta;
