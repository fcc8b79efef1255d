/*
 * dpspark: a Delta Lake LogStore whose commits are exclusive between drivers.
 *
 * Delta's optimistic concurrency needs one thing from the storage: writing the commit file
 * _delta_log/<version>.json must fail, atomically, when that file already exists. Otherwise two
 * drivers that commit the same version both "succeed" and one commit is silently lost (for the
 * privacy ledger: a charge that never happened). Delta's default stores give that within one JVM
 * (a lock) but not between drivers on S3 (exists-then-PUT) nor on a local disk (exists-then-rename,
 * and a local rename replaces its target).
 *
 * This store creates a new commit file in one atomic step on each storage it serves:
 *  - s3a://: a conditional PUT (If-None-Match: *), through Hadoop 3.5's createFile() option
 *    fs.option.create.conditional.overwrite, required with must(): a store or a setting
 *    (fs.s3a.create.conditional.enabled=false) that cannot honour it fails the commit, never
 *    writes it unconditionally. A 412 (or 409, a concurrent conditional write) answer is the
 *    FileAlreadyExistsException Delta expects, and Delta retries on the new version.
 *  - file:: the content goes to a temporary file beside the target, then a hard link to the
 *    target name (link(2) fails with EEXIST when the target exists).
 * Any other scheme is refused (UnsupportedOperationException): configure it for s3a and file only.
 * The content is buffered first, so nothing partial is ever visible. Reads and listings are
 * HadoopFileSystemLogStore's (S3 and local listings are strongly consistent).
 *
 * Built into dpspark/jars/dpspark-logstore.jar by scripts/build_logstore.sh (javac --release 17
 * against delta-storage and Spark's Hadoop client); tests/test_object_store.py checks the jar was
 * built from this source.
 */
package io.dpspark.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Iterator;
import java.util.UUID;

public class ExclusiveCreateLogStore extends HadoopFileSystemLogStore {

    static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    public ExclusiveCreateLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    private static byte[] content(Iterator<String> actions) {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            byte[] line = (actions.next() + "\n").getBytes(StandardCharsets.UTF_8);
            buffer.write(line, 0, line.length);
        }
        return buffer.toByteArray();
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        String scheme = fs.getScheme();
        byte[] bytes = content(actions);
        if ("s3a".equals(scheme)) {
            if (overwrite) {
                try (FSDataOutputStream out = fs.create(path, true)) {
                    out.write(bytes);
                }
                return;
            }
            try {
                FSDataOutputStream out =
                    (FSDataOutputStream) fs.createFile(path).overwrite(true).must(CONDITIONAL_CREATE, true).build();
                out.write(bytes);
                out.close();
            } catch (IOException e) {
                if (existsAnswer(e)) {
                    throw new FileAlreadyExistsException(path.toString());
                }
                throw e;
            }
        } else if ("file".equals(scheme)) {
            java.nio.file.Path target = Paths.get(fs.makeQualified(path).toUri());
            java.nio.file.Path temp = target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
            Files.createDirectories(target.getParent());
            Files.write(temp, bytes);
            try {
                if (overwrite) {
                    Files.move(temp, target, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
                               java.nio.file.StandardCopyOption.ATOMIC_MOVE);
                } else {
                    Files.createLink(target, temp);  // EEXIST: java.nio.file.FileAlreadyExistsException
                }
            } finally {
                Files.deleteIfExists(temp);
            }
        } else {
            throw new UnsupportedOperationException(
                "io.dpspark.delta.ExclusiveCreateLogStore serves s3a:// and file: paths only, not " + path);
        }
    }

    /** A 412 Precondition Failed (the object exists) or 409 (a concurrent conditional write) anywhere in the chain. */
    private static boolean existsAnswer(Throwable error) {
        for (Throwable t = error; t != null; t = t.getCause()) {
            String name = t.getClass().getName();
            String text = String.valueOf(t.getMessage());
            if (name.endsWith("RemoteFileChangedException") || text.contains("412") || text.contains("PreconditionFailed")
                    || text.contains("Precondition Failed") || text.contains("ConditionalRequestConflict")) {
                return true;
            }
            if (t.getCause() == t) {
                break;
            }
        }
        return false;
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }
}
