// The tables, indexes and enum types Optuna 3.1 creates (schema 12, alembic v3.0.0.d), as
// SQLAlchemy emits them for SQLite and for PostgreSQL, so Optuna opens a seqforge study unchanged.
#include "db.hpp"
#include "seqforge/tune/storage.hpp"

namespace seqforge::tune {

void create_optuna_schema(Db& db) {
  const bool pg = db.postgres();
  const std::string id = pg ? "SERIAL NOT NULL" : "INTEGER NOT NULL";
  const std::string flt = pg ? "FLOAT(53)" : "FLOAT";
  const std::string dt = pg ? "TIMESTAMP WITHOUT TIME ZONE" : "DATETIME";
  const std::string dir = pg ? "studydirection" : "VARCHAR(8)";
  const std::string state = pg ? "trialstate" : "VARCHAR(8)";
  const std::string vtype = pg ? "trialvaluetype" : "VARCHAR(7)";
  const std::string itype = pg ? "trialintermediatevaluetype" : "VARCHAR(7)";
  if (pg) {  // SQLAlchemy's native enum types, named after the Python enums
    db.query("CREATE TYPE studydirection AS ENUM ('NOT_SET', 'MINIMIZE', 'MAXIMIZE')");
    db.query("CREATE TYPE trialstate AS ENUM ('RUNNING', 'COMPLETE', 'PRUNED', 'FAIL', 'WAITING')");
    db.query("CREATE TYPE trialvaluetype AS ENUM ('FINITE', 'INF_POS', 'INF_NEG')");
    db.query(
        "CREATE TYPE trialintermediatevaluetype AS ENUM ('FINITE', 'INF_POS', 'INF_NEG', "
        "'NAN')");
  }
  db.query("CREATE TABLE studies (\n\tstudy_id " + id +
           ", \n\tstudy_name VARCHAR(512) NOT NULL, \n\tPRIMARY KEY (study_id)\n)");
  db.query("CREATE UNIQUE INDEX ix_studies_study_name ON studies (study_name)");
  db.query(
      "CREATE TABLE version_info (\n\tversion_info_id INTEGER NOT NULL, \n\tschema_version "
      "INTEGER, \n\tlibrary_version VARCHAR(256), \n\tPRIMARY KEY (version_info_id), \n\tCHECK "
      "(version_info_id=1)\n)");
  db.query("CREATE TABLE study_directions (\n\tstudy_direction_id " + id + ", \n\tdirection " +
           dir +
           " NOT NULL, \n\tstudy_id INTEGER NOT NULL, \n\tobjective INTEGER NOT NULL, "
           "\n\tPRIMARY KEY (study_direction_id), \n\tUNIQUE (study_id, objective), "
           "\n\tFOREIGN KEY(study_id) REFERENCES studies (study_id)\n)");
  for (const char* owner : {"study", "trial"}) {
    for (const char* kind : {"user", "system"}) {
      const std::string o = owner;
      const std::string parent = o == "study" ? "studies" : "trials";
      db.query("CREATE TABLE " + o + "_" + kind + "_attributes (\n\t" + o + "_" + kind +
               "_attribute_id " + id + ", \n\t" + o +
               "_id INTEGER, \n\t\"key\" VARCHAR(512), "
               "\n\tvalue_json TEXT, \n\tPRIMARY KEY (" +
               o + "_" + kind + "_attribute_id), \n\tUNIQUE (" + o +
               "_id, \"key\"), \n\tFOREIGN KEY(" + o + "_id) REFERENCES " + parent + " (" + o +
               "_id)\n)");
    }
    if (std::string(owner) == "study")
      db.query("CREATE TABLE trials (\n\ttrial_id " + id +
               ", \n\tnumber INTEGER, \n\tstudy_id INTEGER, \n\tstate " + state +
               " NOT NULL, \n\tdatetime_start " + dt + ", \n\tdatetime_complete " + dt +
               ", \n\tPRIMARY KEY (trial_id), \n\tFOREIGN KEY(study_id) REFERENCES studies "
               "(study_id)\n)");
  }
  db.query("CREATE TABLE trial_params (\n\tparam_id " + id +
           ", \n\ttrial_id INTEGER, \n\tparam_name VARCHAR(512), \n\tparam_value " + flt +
           ", \n\tdistribution_json TEXT, \n\tPRIMARY KEY (param_id), \n\tUNIQUE (trial_id, "
           "param_name), \n\tFOREIGN KEY(trial_id) REFERENCES trials (trial_id)\n)");
  db.query("CREATE TABLE trial_values (\n\ttrial_value_id " + id +
           ", \n\ttrial_id INTEGER NOT NULL, \n\tobjective INTEGER NOT NULL, \n\tvalue " + flt +
           ", \n\tvalue_type " + vtype +
           " NOT NULL, \n\tPRIMARY KEY (trial_value_id), \n\tUNIQUE (trial_id, objective), "
           "\n\tFOREIGN KEY(trial_id) REFERENCES trials (trial_id)\n)");
  db.query("CREATE TABLE trial_intermediate_values (\n\ttrial_intermediate_value_id " + id +
           ", \n\ttrial_id INTEGER NOT NULL, \n\tstep INTEGER NOT NULL, "
           "\n\tintermediate_value " +
           flt + ", \n\tintermediate_value_type " + itype +
           " NOT NULL, \n\tPRIMARY KEY (trial_intermediate_value_id), \n\tUNIQUE (trial_id, "
           "step), \n\tFOREIGN KEY(trial_id) REFERENCES trials (trial_id)\n)");
  db.query("CREATE TABLE trial_heartbeats (\n\ttrial_heartbeat_id " + id +
           ", \n\ttrial_id INTEGER NOT NULL, \n\theartbeat " + dt +
           " NOT NULL, \n\tPRIMARY KEY (trial_heartbeat_id), \n\tUNIQUE (trial_id), "
           "\n\tFOREIGN KEY(trial_id) REFERENCES trials (trial_id)\n)");
  db.query(
      "CREATE TABLE alembic_version (\n\tversion_num VARCHAR(32) NOT NULL, \n\tCONSTRAINT "
      "alembic_version_pkc PRIMARY KEY (version_num)\n)");
  db.query(
      "INSERT INTO version_info (version_info_id, schema_version, library_version) VALUES (1, "
      "?, ?)",
      {std::to_string(kOptunaSchemaVersion), kOptunaLibraryVersion});
  db.query("INSERT INTO alembic_version (version_num) VALUES (?)", {kOptunaAlembicRevision});
}

}  // namespace seqforge::tune
