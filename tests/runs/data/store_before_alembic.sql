-- A run store made by the workbench before Alembic (commit 80ab631, PRAGMA user_version 2):
-- tests/runs/test_migrations.py rebuilds the file from this dump and opens it with today's code.
PRAGMA user_version = 2;
BEGIN TRANSACTION;
CREATE TABLE diagnostics (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
INSERT INTO "diagnostics" VALUES('grpo-s0',3,13.0,'{"ratio": [[1.0, 1.1]], "region": [[0, 1]], "region_names": ["trust"]}');
INSERT INTO "diagnostics" VALUES('grpo-s1',3,13.0,'{"ratio": [[1.0, 1.1]], "region": [[0, 1]], "region_names": ["trust"]}');
INSERT INTO "diagnostics" VALUES('rloo-s0',3,13.0,'{"ratio": [[1.0, 1.1]], "region": [[0, 1]], "region_names": ["trust"]}');
INSERT INTO "diagnostics" VALUES('rloo-s1',3,13.0,'{"ratio": [[1.0, 1.1]], "region": [[0, 1]], "region_names": ["trust"]}');
CREATE TABLE lens (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
INSERT INTO "lens" VALUES('grpo-s0',3,13.0,'{"cosine": {"grpo": 1.0}}');
INSERT INTO "lens" VALUES('grpo-s1',3,13.0,'{"cosine": {"grpo": 1.0}}');
INSERT INTO "lens" VALUES('rloo-s0',3,13.0,'{"cosine": {"grpo": 1.0}}');
INSERT INTO "lens" VALUES('rloo-s1',3,13.0,'{"cosine": {"grpo": 1.0}}');
CREATE TABLE metrics (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
INSERT INTO "metrics" VALUES('grpo-s0',0,10.0,'{"reward": 0.2, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s0',1,11.0,'{"reward": 0.30000000000000004, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s0',2,12.0,'{"reward": 0.4, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s0',3,13.0,'{"reward": 0.5, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s1',0,10.0,'{"reward": 0.21000000000000002, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s1',1,11.0,'{"reward": 0.31000000000000005, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s1',2,12.0,'{"reward": 0.41000000000000003, "kl": 0.001}');
INSERT INTO "metrics" VALUES('grpo-s1',3,13.0,'{"reward": 0.51, "kl": 0.001}');
INSERT INTO "metrics" VALUES('lone',0,5.0,'{"reward": 0.5}');
INSERT INTO "metrics" VALUES('rloo-s0',0,10.0,'{"reward": 0.0, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s0',1,11.0,'{"reward": 0.1, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s0',2,12.0,'{"reward": 0.2, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s0',3,13.0,'{"reward": 0.30000000000000004, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s1',0,10.0,'{"reward": 0.01, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s1',1,11.0,'{"reward": 0.11, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s1',2,12.0,'{"reward": 0.21000000000000002, "kl": 0.001}');
INSERT INTO "metrics" VALUES('rloo-s1',3,13.0,'{"reward": 0.31000000000000005, "kl": 0.001}');
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    status TEXT NOT NULL,
    target TEXT NOT NULL,
    launcher TEXT NOT NULL,
    host TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    grp TEXT,
    tags TEXT NOT NULL DEFAULT '[]',
    notes TEXT NOT NULL DEFAULT '',
    recipe TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    launch TEXT NOT NULL DEFAULT '{}',
    handle TEXT NOT NULL DEFAULT '{}',
    events_offset INTEGER NOT NULL DEFAULT 0,
    events_inode TEXT,
    last_step INTEGER NOT NULL DEFAULT -1,
    total_steps INTEGER NOT NULL,
    reward REAL,
    error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    skipped_events INTEGER NOT NULL DEFAULT 0,
    warnings TEXT NOT NULL DEFAULT '[]',
    arm TEXT,
    seed INTEGER,
    sweep TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO "runs" VALUES('grpo-s0','grpo','grpo','finished','local','local','localhost','ann',1.79568315412233400337e+09,NULL,1.79568315416554450986e+09,'g','["old"]','','name: grpo
train:
  seed: 0
','/runs/grpo-s0','{"num_processes": 1}','{}',1234,'1:2',3,4,0.5,NULL,0,0,'[]','grpo',0,'{}');
INSERT INTO "runs" VALUES('grpo-s1','grpo','grpo','finished','local','local','localhost','ann',1.79568315417774581905e+09,NULL,1.79568315421223163603e+09,'g','["old"]','','name: grpo
train:
  seed: 1
','/runs/grpo-s1','{"num_processes": 1}','{}',1234,'1:2',3,4,0.51,NULL,0,0,'[]','grpo',1,'{}');
INSERT INTO "runs" VALUES('rloo-s0','rloo','rloo','finished','local','local','localhost','ann',1.79568315423975491526e+09,NULL,1.79568315429695630073e+09,'g','["old"]','','name: rloo
train:
  seed: 0
','/runs/rloo-s0','{"num_processes": 1}','{}',1234,'1:2',3,4,3.00000000000000044408e-01,NULL,0,0,'[]','rloo',0,'{}');
INSERT INTO "runs" VALUES('rloo-s1','rloo','rloo','finished','local','local','localhost','ann',1.79568315432539343835e+09,NULL,1.79568315440140342711e+09,'g','["old"]','','name: rloo
train:
  seed: 1
','/runs/rloo-s1','{"num_processes": 1}','{}',1234,'1:2',3,4,3.1000000000000005329e-01,NULL,0,0,'[]','rloo',1,'{}');
INSERT INTO "runs" VALUES('lone','lone run','grpo','failed','ssh://gpu1','ssh','gpu1','bob',1.79568315443320536614e+09,NULL,1.79568315452169871334e+09,NULL,'[]','kept','name: grpo
','/runs/lone','{}','{"pid": 7}',0,NULL,0,4,0.5,'ValueError: boom',0,1,'["1 event was skipped; first: not a JSON object: [1]"]','lone run',0,'{}');
CREATE TABLE samples (run_id TEXT, step INTEGER, time REAL, data TEXT,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
INSERT INTO "samples" VALUES('grpo-s0',3,13.0,'[{"prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "length": 1, "truncated": false}]');
INSERT INTO "samples" VALUES('grpo-s1',3,13.0,'[{"prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "length": 1, "truncated": false}]');
INSERT INTO "samples" VALUES('rloo-s0',3,13.0,'[{"prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "length": 1, "truncated": false}]');
INSERT INTO "samples" VALUES('rloo-s1',3,13.0,'[{"prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "length": 1, "truncated": false}]');
CREATE INDEX runs_status ON runs(status);
CREATE INDEX runs_grp ON runs(grp);
CREATE UNIQUE INDEX runs_grp_arm_seed ON runs(grp, arm, seed) WHERE grp IS NOT NULL;
COMMIT;
