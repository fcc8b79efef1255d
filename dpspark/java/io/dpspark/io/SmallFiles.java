/*
 * dpspark: small files (summary.json, the report, operator records) written by the Spark server, for
 * a Spark Connect client that has no JVM and no disk in common with the server.
 *
 * A Connect client cannot open a Hadoop FileSystem: it sends these UDFs one row (a path, and the
 * bytes the client already holds) and the server's JVM does the file system call, with the Hadoop
 * settings of the server's Spark application (hadoopConf() below: the same credentials and
 * endpoints its own table reads and writes use). The client registers them per
 * session (spark.udf.registerJavaFunction) and evaluates each on a one-row local relation.
 *
 *  - Write(path, bytes) -> path: the whole content in one step. On an object store (s3a://, s3://,
 *    gs://, abfs[s]://, wasb[s]://) one create() of the target: the object becomes visible whole
 *    when the stream closes (one PUT or a completed multipart upload). Elsewhere (a local or
 *    shared disk, HDFS) a temporary file beside the target, then delete and rename, as dpspark's
 *    classic sessions write these files.
 *  - Delete(path) -> whether a file was removed (a missing file is not an error).
 *  - Kind(path) -> "missing", "file" or "directory".
 *
 * What travels is what the client already holds and may show: released values, public parameters,
 * the operator's record. Nothing here reads a private table. These functions are not
 * deterministic (they have effects): the client marks them so, and evaluates each once per call.
 *
 * Built into dpspark/jars/dpspark-logstore.jar (with the log store) by scripts/build_logstore.sh:
 * the jar a Connect server already loads for the ledger (docs/cluster.md).
 */
package io.dpspark.io;

import java.io.IOException;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.api.java.UDF2;

import scala.Tuple2;

public final class SmallFiles {
    private static final String HADOOP_PREFIX = "spark.hadoop.";
    private static final String[] OBJECT_STORES = {"s3a", "s3", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss"};

    private SmallFiles() {
    }

    /**
     * Hadoop's settings as the server's own table writes see them. In the driver's JVM (local mode,
     * or a call evaluated on the driver): the SparkContext's Hadoop configuration, settings made at
     * run time included. On an executor of a cluster: core-site.xml and every spark.hadoop.*
     * setting of the application (runtime-only changes of the driver's configuration do not reach
     * it: a deployment sets its store's access in its Spark configuration).
     */
    static Configuration hadoopConf() {
        SparkEnv env = SparkEnv.get();
        if (env != null && "driver".equals(env.executorId())) {
            return new Configuration(SparkContext.getOrCreate().hadoopConfiguration());
        }
        Configuration conf = new Configuration();
        if (env != null) {
            for (Tuple2<String, String> entry : env.conf().getAll()) {
                if (entry._1().startsWith(HADOOP_PREFIX)) {
                    conf.set(entry._1().substring(HADOOP_PREFIX.length()), entry._2());
                }
            }
        }
        return conf;
    }

    static boolean onObjectStore(Path path) {
        String scheme = path.toUri().getScheme();
        if (scheme == null) {
            return false;
        }
        for (String store : OBJECT_STORES) {
            if (store.equalsIgnoreCase(scheme)) {
                return true;
            }
        }
        return false;
    }

    /** Write the bytes to the path (see the file's comment); returns the path. */
    public static final class Write implements UDF2<String, byte[], String> {
        @Override
        public String call(String path, byte[] data) throws IOException {
            Path target = new Path(path);
            FileSystem fs = target.getFileSystem(hadoopConf());
            if (onObjectStore(target)) {
                try (FSDataOutputStream out = fs.create(target, true)) {
                    out.write(data);
                }
                return path;
            }
            Path tmp = new Path(target.getParent(), "." + target.getName() + ".tmp-" + UUID.randomUUID());
            try (FSDataOutputStream out = fs.create(tmp, true)) {
                out.write(data);
            }
            fs.delete(target, false);
            if (!fs.rename(tmp, target)) {
                fs.delete(tmp, false);
                throw new IOException("could not rename " + tmp + " to " + target);
            }
            return path;
        }
    }

    /** Remove the file at the path; true if one was removed. */
    public static final class Delete implements UDF1<String, Boolean> {
        @Override
        public Boolean call(String path) throws IOException {
            Path target = new Path(path);
            FileSystem fs = target.getFileSystem(hadoopConf());
            return fs.exists(target) && fs.delete(target, false);
        }
    }

    /** "missing", "file" or "directory". */
    public static final class Kind implements UDF1<String, String> {
        @Override
        public String call(String path) throws IOException {
            Path target = new Path(path);
            FileSystem fs = target.getFileSystem(hadoopConf());
            FileStatus status;
            try {
                status = fs.getFileStatus(target);
            } catch (java.io.FileNotFoundException missing) {
                return "missing";
            }
            return status.isDirectory() ? "directory" : "file";
        }
    }
}
